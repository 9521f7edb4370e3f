"""Parsing what mpirun prints: per-rank tags and its own failure reports. Pure functions."""

from __future__ import annotations

import re
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
