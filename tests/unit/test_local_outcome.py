"""launch/local/outcome.py: which rank failed first. A race seen in a fresh-clone run of the suite
(2026-12-07, tests/mpi/test_local_runs.py, ddp): rank 0 was SIGKILLed at step 9; rank 1 lost its
Gloo peer and exited 1 before mpirun noticed rank 0, so mpirun reported rank 1 and the run blamed
it. The records (error-rank1.json's words) are those of that run."""

from __future__ import annotations

import json
from collections import deque
from pathlib import Path

from hpctrain.launch.local.outcome import failure_of

PEER_LOST = (
    "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:48860: "
    "Connection reset by peer. This is typically caused by a remote worker hanging or bugs in the application."
)
MPIRUN = (
    "Primary job  terminated normally, but 1 process returned\na non-zero exit code. Per user-direction, the job "
    "has been aborted.\n-------\nmpirun detected that one or more processes exited with non-zero status, thus "
    "causing\nthe job to be terminated. The first process to do so was:\n\n  Process name: [[4242,1],1]\n  "
    "Exit code:    1\n"
)


def _run(tmp_path: Path, errors: dict[int, str], world: int = 2) -> Path:
    (tmp_path / "plan.json").write_text(json.dumps({"world_size": world}))
    for rank, message in errors.items():
        record = {
            "host": "vm",
            "message": message,
            "rank": rank,
            "time": 1.0,
            "traceback": "",
            "type": "RuntimeError",
        }
        (tmp_path / f"error-rank{rank}.json").write_text(json.dumps(record))
    return tmp_path


def test_the_rank_that_ended_without_a_word_is_the_cause_not_the_one_mpirun_saw_first(tmp_path: Path) -> None:
    tails: dict[int | None, deque[str]] = {
        0: deque(["step 9/400"]),
        1: deque(["RuntimeError: ... reset by peer"]),
    }
    f = failure_of(_run(tmp_path, {1: PEER_LOST}), 1, tails, MPIRUN)
    assert f.rank == 0 and f.tail == "step 9/400", f
    assert (
        f.cause.startswith("ended without an error of its own")
        and "rank 1, which mpirun reported first (exited with status 1), only lost its peer" in f.cause
    )


def test_a_rank_mpirun_reports_with_an_error_of_its_own_stays_the_cause(tmp_path: Path) -> None:
    tails: dict[int | None, deque[str]] = {0: deque(), 1: deque()}
    own, four = tmp_path / "own", tmp_path / "four"
    own.mkdir()
    four.mkdir()
    f = failure_of(_run(own, {1: "CUDA out of memory"}), 1, tails, MPIRUN)
    assert f.rank == 1 and "CUDA out of memory" in f.cause, f
    # two ranks without a word (4 ranks, 2 lost their peer): not clear which; mpirun's report stands
    f = failure_of(_run(four, {1: PEER_LOST, 3: PEER_LOST}, 4), 1, tails, MPIRUN)
    assert f.rank == 1 and f.cause == "exited with status 1", f


def test_a_runs_elapsed_time_reads_as_squeues_and_a_damaged_one_as_unknown() -> None:
    from hpctrain.launch.local.launcher import elapsed_text

    assert [elapsed_text(x) for x in (0.0, 3725.9, 90061.0, -5.0)] == [
        "00:00:00",
        "01:02:05",
        "1-01:01:01",
        "00:00:00",
    ]
    assert elapsed_text(1e308) == elapsed_text(float("nan")) == elapsed_text(float("inf")) == "-"
