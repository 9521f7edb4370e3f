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
