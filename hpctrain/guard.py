"""The group guard (lifeline.guard_group): a small process that outlives a SLURM task's rank by
moments and ends what the rank left behind. Run as a file, `python -I -S guard.py RANK_PID`,
never imported by the rank: nothing of hpctrain, torch or site-packages loads (about 10 ms), and
it is no fork of a rank that has threads.

A step's tasks are signalled through their process tree (proctrack/linuxproc) or their process
group (proctrack/pgid). A rank killed first (srun --kill-on-bad-exit, a stall report's exit, the
OOM killer) leaves its children re-parented to init, outside the tree, and under submitit a rank
ignores SIGTERM, so it cannot end them itself. The guard asks for a parent-death signal, waits for
it, and then ends the rank's orphans: the processes of the rank's process group started with or
after the rank whose parent is neither a live process of that group nor on the step's side (the
rank's parent and, when that is the host's wrapper around a rank in an image, the step daemon
above it: container/plan.py), and their descendants. The step's other tasks are the step side's
children and the wrapper is the step side itself, so both are left alone.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
CALM = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR2, signal.SIGCONT)


def stat(pid: int | str) -> tuple[int, int, int] | None:
    """(parent, process group, start time in clock ticks) of a live process; None once gone or a
    zombie. `man 5 proc`: fields 4, 5 and 22, counted after the command name's last ')'."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[1]), int(fields[2]), int(fields[19])


def step_side(rank: int) -> set[int]:
    """The rank's ancestors up to the first outside its process group: its parent (the step
    daemon, or in an image the host's wrapper) and, above a wrapper, the step daemon. The step's
    tasks are their children; an orphan's parent is neither."""
    out, p = set(), rank
    mine = stat(rank)
    group = mine[1] if mine else -1
    while (s := stat(p)) is not None and s[0] > 1:
        out.add(s[0])
        up = stat(s[0])
        if up is None or up[1] != group:
            break
        p = s[0]
    return out


def left_behind(rank: int, group: int, born: int, protected: set[int]) -> dict[int, int]:
    """The rank's orphans and their descendants, as pid -> start time, from /proc now."""
    procs = {int(e): s for e in os.listdir("/proc") if e.isdigit() and (s := stat(e)) is not None}
    procs.pop(os.getpid(), None)
    return orphans(procs, rank, group, born, protected)


def orphans(
    procs: dict[int, tuple[int, int, int]], rank: int, group: int, born: int, protected: set[int]
) -> dict[int, int]:
    """Pure: of `procs` (pid -> stat()), the processes of the rank's group started with or after
    it (clock ticks: its wrapper may share its tick) whose parent is neither a live member of the
    group nor on the step's side (step_side), and their descendants."""
    members = {p for p, (_, g, _) in procs.items() if g == group}
    out = {
        p: st
        for p, (parent, g, st) in procs.items()
        if g == group
        and st >= born
        and p != rank
        and p not in protected
        and parent not in members
        and parent not in protected
    }
    grew = True
    while grew:
        more = {p: st for p, (parent, _, st) in procs.items() if parent in out and p not in out}
        out.update(more)
        grew = bool(more)
    return out


def end(found: dict[int, int], grace_s: float = 2.0) -> None:
    """SIGTERM, then SIGKILL after `grace_s` to those still there (the same process: its start
    time unchanged, so a reused pid is never signalled)."""
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 1.0)):
        for p, st in found.items():
            if (s := stat(p)) is not None and s[2] == st:
                try:
                    os.kill(p, sig)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            found = {p: st for p, st in found.items() if (s := stat(p)) is not None and s[2] == st}
            if not found:
                return
            time.sleep(0.05)


def main(rank: int) -> None:
    for sig in CALM:  # what the step sends its whole tree is for the rank, not for the guard
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, int(signal.SIGUSR1), 0, 0, 0)
    mine = stat(rank)
    if mine is None or os.getppid() != rank:
        return  # the rank ended before the guard was ready: nothing to guard
    _, group, born = mine
    protected = step_side(rank)
    os.write(1, b"ready\n")  # the rank waits for this line: a death from now on is seen
    os.close(1)
    signal.sigwait({signal.SIGUSR1})
    deadline = time.monotonic() + 5.0
    while stat(rank) is not None and time.monotonic() < deadline:  # the signal comes mid-exit,
        time.sleep(0.01)  # before the rank's other children are re-parented
    deadline = time.monotonic() + 3.0  # orphans of orphans: until none is left, at most 3 s
    while (found := left_behind(rank, group, born, protected)) and time.monotonic() < deadline:
        end(found)


if __name__ == "__main__":
    main(int(sys.argv[1]))
