"""Parsing mpirun's output: rank tags and failure reports (real text recorded from OpenMPI 4.1)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpctrain.events import format_event, parse_event
from hpctrain.launch.output import mpirun_failure, split_tag


def test_split_tag() -> None:
    line = split_tag("[1,3]<stderr>:Traceback (most recent call last):", "stderr")
    assert (line.rank, line.stream, line.text) == (3, "stderr", "Traceback (most recent call last):")
    plain = split_tag("mpirun noticed that ...", "stderr")
    assert plain.rank is None and plain.text == "mpirun noticed that ..."
    assert split_tag("[1,0]<stdout>:", "stdout").text == ""
    # an unbuffered print arrives as "text" and "\n", each tagged: the inner tag is dropped
    assert split_tag("[1,0]<stdout>:step 3/10[1,0]<stdout>:", "stdout").text == "step 3/10"


def test_events_round_trip_and_ignore_other_lines() -> None:
    line = format_event("progress", step=3, steps=10, loss=1.5)
    assert parse_event(line) == {"event": "progress", "step": 3, "steps": 10, "loss": 1.5}
    assert parse_event("step 3/10 loss 1.5") is None
    assert parse_event("@@hpctrain {not json") is None


FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


@pytest.mark.parametrize(
    "fixture,rank,cause",
    [
        ("openmpi-4.1-rank-exit.txt", 1, "exited with status 3"),
        ("openmpi-4.1-rank-signal.txt", 1, "killed by signal 9 (Killed) on vm"),
    ],
)
def test_mpirun_failure_reports(fixture: str, rank: int, cause: str) -> None:
    """Recorded from OpenMPI 4.1.4's mpirun when rank 1 exits 3 / is SIGKILLed."""
    assert mpirun_failure((FIXTURES / fixture).read_text()) == (rank, cause)


def test_no_failure_in_ordinary_output() -> None:
    assert mpirun_failure("step 3/10 loss 1.5\nall good") is None
