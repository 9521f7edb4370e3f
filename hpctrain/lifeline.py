"""Processes that end with their parent, whatever kills the parent (SIGKILL included): Linux's
parent-death signal, prctl(PR_SET_PDEATHSIG) (man 2 PR_SET_PDEATHSIG).

The local launcher uses it twice: mpirun gets SIGTERM when its supervisor dies (mpirun then
stops the ranks, stopped ones included), and every rank gets SIGKILL when mpirun dies. Elsewhere
(macOS, no setpriv) it is a no-op: the supervisor's own signal handling still applies.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import sys

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(sig: signal.Signals = signal.SIGKILL) -> bool:
    """From now on this process receives `sig` when its parent exits. False if not supported."""
    if not sys.platform.startswith("linux"):
        return False
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        return False
    if os.getppid() != parent:  # the parent died just before the prctl: act as if after it
        os.kill(os.getpid(), sig)
    return True


def with_lifeline(argv: list[str], sig: str = "TERM") -> list[str]:
    """argv run so that it receives SIG{sig} when the calling process dies (util-linux setpriv
    sets the parent-death signal and execs; no preexec_fn in a process that has threads)."""
    setpriv = shutil.which("setpriv")
    if setpriv is None or not sys.platform.startswith("linux"):
        return argv
    return [setpriv, f"--pdeathsig={sig}", *argv]


PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>


def become_subreaper() -> bool:
    """Orphaned descendants (a script's detached `sleep &`, a double fork) are re-parented to this
    process instead of init, so end_descendants() finds them. False if not supported."""
    if not sys.platform.startswith("linux"):
        return False
    return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def stat_fields(path: str) -> list[str] | None:
    """The fields of a /proc stat file (/proc/PID/stat, /proc/PID/task/TID/stat) from the state on
    (`man 5 proc`'s field 3 at index 0), or None once the process has gone. Split after the last
    ')': the command name before it may hold spaces and parentheses."""
    try:
        with open(path) as f:
            stat = f.read()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2 :].split()


def descendants(pid: int) -> list[int]:
    """Live descendants of `pid` (from /proc: each process's parent), children first."""
    parents: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        fields = stat_fields(f"/proc/{entry.name}/stat")
        if fields is not None and fields[0] not in ("Z", "X"):  # None: ended meanwhile
            parents[int(entry.name)] = int(fields[1])
    out, frontier = [], [pid]
    while frontier:
        frontier = [p for p, parent in parents.items() if parent in frontier]
        out += frontier
    return out


def end_descendants(grace_s: float = 2.0) -> list[int]:
    """SIGTERM every descendant of this process, SIGKILL those left after `grace_s`, and reap
    them: when a rank's work ends, nothing it started outlives it or holds its output open.
    The group guard (guard_group) is left alone: it ends after this process."""
    import time

    found = [p for p in descendants(os.getpid()) if p != _guard_pid]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in found:
            try:
                os.kill(p, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + (grace_s if sig == signal.SIGTERM else 1.0)
        while time.monotonic() < deadline:
            _reap()
            found = [p for p in found if p in descendants(os.getpid())]
            if not found:
                return []
            time.sleep(0.05)
    return found


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


_guard_pid: int | None = None


def guard_group() -> int | None:
    """Nothing this process starts outlives it, even when it is killed first (SIGKILL included)
    and its children are re-parented to init: a guard process (hpctrain/guard.py) waits for this
    one's death and ends what it left behind. For a SLURM task, whose step loses track of such
    children. The guard's pid, or None where not supported (not Linux)."""
    global _guard_pid
    import subprocess
    from pathlib import Path

    if not sys.platform.startswith("linux") or _guard_pid is not None:
        return _guard_pid
    script = Path(__file__).with_name("guard.py")
    guard = subprocess.Popen(  # its own session: a signal to this group is not for it
        [sys.executable, "-I", "-S", str(script), str(os.getpid())],
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
    )
    assert guard.stdout is not None
    guard.stdout.readline()  # ready (or gone: an empty line, and no guard)
    guard.stdout.close()
    _guard_pid = guard.pid
    return guard.pid
