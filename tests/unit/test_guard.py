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


def test_who_is_an_orphan_by_hand() -> None:
    """A node of a step: the step daemon 10 (another group), its tasks 20 and 30 in group 20 (the
    first task's pid, as slurmstepd sets it); in an image a task is the host's wrapper 20 around
    the rank 21, started in the same clock tick. The rank 21 died: its worker 22 now hangs under
    init (1) with a child 23. Orphans: 22 and 23, never the wrapper, the other task or its child."""
    from hpctrain.guard import orphans

    procs = {
        10: (1, 10, 100),  # the step daemon
        20: (10, 20, 500),  # the wrapper: the rank's parent, leading the group
        22: (1, 20, 510),  # the rank's worker, re-parented to init
        23: (22, 20, 511),
        30: (10, 20, 500),  # the step's other task
        31: (30, 20, 505),  # its own child
        40: (1, 40, 520),  # another job's process
        9: (1, 20, 50),  # in the group but older than the rank: not the rank's
    }
    assert orphans(procs, rank=21, group=20, born=500, protected={20, 10}) == {22: 510, 23: 511}
    # on the host, without a wrapper: the tasks are the step daemon's children
    host = {k: v for k, v in procs.items() if k != 20}
    assert orphans(host, rank=21, group=20, born=500, protected={10}) == {22: 510, 23: 511}
