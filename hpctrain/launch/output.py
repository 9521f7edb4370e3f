"""Parsing what mpirun and srun print: per-rank tags and their own failure reports. Pure functions."""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass

# `mpirun --tag-output` prefixes every line a rank prints: "[1,3]<stderr>:text" (jobid, rank).
TAG = re.compile(r"^\[(\d+),(\d+)\]<(stdout|stderr)>:(.*)$")
# A write split by the pipe comes back as two tagged fragments on one line; drop the inner tag.
INNER_TAG = re.compile(r"\[\d+,\d+\]<(?:stdout|stderr)>:")
# mpirun's report when a rank dies by a signal, e.g. after SIGKILL or a segfault.
SIGNALLED = re.compile(r"process rank (\d+) with PID \d+ on node (\S+) exited on signal (\d+) \(([^)]*)\)")
# mpirun's report when a rank exits non-zero (older and newer wordings).
EXITED = re.compile(
    r"(?:Process name: \[\[\d+,\d+\],(\d+)\][\s\S]*?Exit code:\s+(\d+))"
    r"|(?:process rank (\d+) with PID \d+ on node \S+ exited with (?:non-zero status|status) (\d+))"
)


# srun's report in the job's stderr, e.g. "srun: error: n2: task 1: Killed", "tasks 0-1: Terminated"
SRUN_TASKS = re.compile(r"^srun: error: (\S+): tasks? (\d+)(?:-\d+)?(?:,[\d,-]+)?: (.+)$", re.MULTILINE)


@dataclass(frozen=True)
class Line:
    rank: int | None  # None: mpirun's own output
    stream: str  # "stdout" or "stderr"
    text: str


def split_tag(raw: str, stream: str) -> Line:
    m = TAG.match(raw)
    if m:
        return Line(int(m.group(2)), m.group(3), INNER_TAG.sub("", m.group(4)))
    return Line(None, stream, raw)


def mpirun_failure(text: str) -> tuple[int | None, str] | None:
    """(rank, cause) from mpirun's own messages, or None if it reports no rank failure."""
    m = SIGNALLED.search(text)
    if m:
        return int(m.group(1)), f"killed by signal {m.group(3)} ({m.group(4)}) on {m.group(2)}"
    m = EXITED.search(text)
    if m:
        rank = m.group(1) or m.group(3)
        code = m.group(2) or m.group(4)
        return int(rank), f"exited with status {code}"
    return None


def srun_failure(text: str) -> tuple[int, str] | None:
    """(rank, cause) of the first task srun reports as failed. Tasks srun itself "Terminated"
    (--kill-on-bad-exit ending the others) are the consequence, not the cause: named only if
    nothing else is."""
    found = [(int(m.group(2)), m.group(3).strip(), m.group(1)) for m in SRUN_TASKS.finditer(text)]
    for rank, cause, node in sorted(found, key=lambda f: f[1] == "Terminated"):
        code = re.match(r"Exited with exit code (\d+)", cause)
        if code:
            return rank, f"exited with status {code.group(1)} on {node}"
        sig = SIGNAL_TEXTS.get(cause)  # srun prints strsignal(3): "Killed", "Segmentation fault"
        return rank, f"killed by signal {int(sig)} ({sig.name}) on {node}" if sig else f"{cause} on {node}"
    return None


SIGNAL_TEXTS = {signal.strsignal(s): s for s in signal.Signals if signal.strsignal(s)}
