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


def test_array_tasks_that_never_started_take_the_arrays_state() -> None:
    """Recorded on the local cluster: a 16-task array cancelled while pending has one record,
    `1152`, and none for `1152_0`; a partly started array lists its unsplit rest as `1153_[2-15%4]`."""
    from hpctrain.launch.sacct import with_array_tasks

    cancelled = parse_sacct("1152|submit|CANCELLED by 0|1|00:00:00|0:0|None assigned\n")
    states = with_array_tasks(["1152_0", "1152_15"], cancelled)
    assert states["1152_0"].state == "CANCELLED" and states["1152_0"].done
    assert states["1152_15"].job_id == "1152_15"
    partly = parse_sacct(
        "1153_0|x|RUNNING|1|00:00:09|0:0|n1\n"
        "1153_1|x|COMPLETED|1|00:00:05|0:0|n2\n"
        "1153_[2-15%4]|x|PENDING|1|00:00:00|0:0|None assigned\n"
    )
    states = with_array_tasks(["1153_0", "1153_1", "1153_7", "1153_16"], partly)
    assert [states[k].state for k in ("1153_0", "1153_1", "1153_7")] == ["RUNNING", "COMPLETED", "PENDING"]
    assert "1153_16" not in states  # not in the array's task list: still unknown
