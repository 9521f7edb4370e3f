"""The group guard with real processes: a "step" (a session of its own) starts two "ranks"; one
guards its group, forks a worker that sleeps and is then killed with SIGKILL. The worker,
re-parented to init, must end; the other rank, the step's other child, must live on."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from hpctrain.guard import stat

RANK = textwrap.dedent(
    """
    import os, sys, time
    from hpctrain.lifeline import end_descendants, guard_group
    guard = guard_group()
    worker = os.fork()
    if worker == 0:
        time.sleep(1000)
        os._exit(0)
    if sys.argv[1] == "tidy":  # ends its own children first: the guard then finds nothing
        end_descendants()
    print(guard, worker, flush=True)
    time.sleep(1000)
    """
)
STEP = textwrap.dedent(
    """
    import subprocess, sys, time
    guarded = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]], stdout=subprocess.PIPE, text=True)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1000)"])
    print(guarded.pid, other.pid, guarded.stdout.readline().strip(), flush=True)
    time.sleep(1000)
    """
)


def _gone(pid: int, timeout_s: float = 10) -> bool:
    deadline = time.monotonic() + timeout_s
    while stat(pid) is not None:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _step(mode: str) -> tuple[subprocess.Popen[str], list[int]]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    step = subprocess.Popen(
        [sys.executable, "-c", STEP, RANK, mode],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    assert step.stdout is not None
    return step, [int(x) for x in step.stdout.readline().split()]


def test_a_killed_ranks_orphans_end_and_its_sibling_lives_on() -> None:
    step, (rank, other, guard, worker) = _step("hang")
    try:
        assert stat(worker) is not None and stat(guard) is not None
        os.kill(rank, signal.SIGKILL)
        assert _gone(worker), "the killed rank's worker outlived it"
        assert _gone(guard), "the guard did not end after its work"
        assert stat(other) is not None, "the guard ended the step's other rank"
    finally:
        os.killpg(step.pid, signal.SIGKILL)
        step.wait()


def test_a_rank_that_ended_its_children_itself_leaves_the_guard_nothing_to_do() -> None:
    step, (rank, other, guard, worker) = _step("tidy")
    try:
        assert _gone(worker), "end_descendants left the worker"
        assert stat(guard) is not None, "end_descendants ended the guard, which must outlive the rank"
        os.kill(rank, signal.SIGTERM)
        assert _gone(guard) and stat(other) is not None
    finally:
        os.killpg(step.pid, signal.SIGKILL)
        step.wait()
