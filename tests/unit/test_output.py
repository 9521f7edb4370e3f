"""Parsing mpirun's output: rank tags and failure reports (real text recorded from OpenMPI 4.1)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpctrain.events import format_event, parse_event
from hpctrain.launch.output import Demux, mpirun_failure


def test_tagged_lines_go_back_to_their_ranks() -> None:
    d = Demux()
    [line] = d.feed("[1,3]<stderr>:Traceback (most recent call last):", "stderr")
    assert (line.rank, line.stream, line.text) == (3, "stderr", "Traceback (most recent call last):")
    [plain] = d.feed("mpirun noticed that ...", "stderr")
    assert plain.rank is None and plain.text == "mpirun noticed that ..."
    assert [x.text for x in d.feed("[1,0]<stdout>:", "stdout")] == [""]
    # an unbuffered print arrives as "text" and "\n", each tagged: one line
    assert [x.text for x in d.feed("[1,0]<stdout>:step 3/10[1,0]<stdout>:", "stdout")] == ["step 3/10"]


def test_fragments_of_two_ranks_on_one_line_are_not_mixed() -> None:
    """What OpenMPI 4.1 printed here when two ranks wrote "rank R text" and "\n" apart."""
    d = Demux()
    got = []
    for raw in (
        "[1,1]<stdout>:rank 1 text[1,0]<stdout>:rank 0 text[1,1]<stdout>:",
        "[1,1]<stdout>:second 1",
        "[1,0]<stdout>:",
        "[1,0]<stdout>:second 0",
        "[1,0]<stdout>:no newline at the end[1,1]<stderr>:warning",
    ):
        got += [(x.rank, x.stream, x.text) for x in d.feed(raw, "stdout")]
    got += [(x.rank, x.stream, x.text) for x in d.rest()]
    assert got == [
        (1, "stdout", "rank 1 text"),
        (1, "stdout", "second 1"),
        (0, "stdout", "rank 0 text"),
        (0, "stdout", "second 0"),
        (1, "stderr", "warning"),
        (0, "stdout", "no newline at the end"),
    ]


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


def test_open_mpis_banners_stay_in_the_launcher_log_and_off_the_console(tmp_path) -> None:
    """Round 5, class 11: mpirun's abort banner was printed on the console at every restart; the
    restart's own line (and rank 0's) still are."""
    from pathlib import Path

    from hpctrain.orchestrate.runs import LogFollower

    banner = (Path(__file__).parents[1] / "fixtures" / "openmpi-4.1-rank-signal.txt").read_text()
    log = tmp_path / "launcher.log"
    log.write_text(f"{banner}hpctrain: restart 1: rank 1 on vm: killed by signal 9\n[1,0]<stdout>: step 5\n")

    class Seen:
        lines: list[str] = []

        def note(self, text: str) -> None: ...
        def event(self, event: dict) -> None: ...
        def begin(self, label: str, steps: int) -> None: ...
        def line(self, text: str) -> None:
            self.lines.append(text)

    seen = Seen()
    LogFollower([log], seen)()
    assert seen.lines == ["hpctrain: restart 1: rank 1 on vm: killed by signal 9", "[1,0]<stdout>: step 5"]
