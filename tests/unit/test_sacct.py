"""Parsing `sacct -P` text recorded from SLURM 22.05 on the local cluster (including step lines,
which must be ignored, array tasks, and 'CANCELLED by 0')."""

from __future__ import annotations

from pathlib import Path

from hpctrain.launch.sacct import parse_sacct

TEXT = (Path(__file__).resolve().parents[1] / "fixtures" / "sacct-22.05.txt").read_text()


def test_parse_recorded_sacct_output() -> None:
    states = parse_sacct(TEXT)
    assert sorted(states) == ["1026", "1027", "1028_0", "1028_1", "1028_2", "1029"]
    assert states["1026"].state == "COMPLETED" and states["1026"].done
    assert (
        states["1027"].state == "FAILED" and states["1027"].nodes == 2 and states["1027"].exit_code == "1:0"
    )
    assert states["1029"].state == "CANCELLED"  # "CANCELLED by 0" reduced to its first word
    assert states["1028_1"].nodelist == "n3"


def test_running_and_pending_are_not_done() -> None:
    states = parse_sacct("7|x|RUNNING|1|00:00:03|0:0|n1\n8|x|PENDING|2|00:00:00|0:0|None assigned\n")
    assert not states["7"].done and not states["8"].done


def test_garbage_lines_are_skipped() -> None:
    assert parse_sacct("sacct: error: something\n\n1|x|COMPLETED\n") == {}
