"""Parsing what mpirun and srun print: per-rank tags and their own failure reports. Pure functions."""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass

# `mpirun --tag-output` prefixes every write a rank makes: "[1,3]<stderr>:text" (jobid, rank).
# A write without its newline (an unbuffered print writes text and "\n" apart) is forwarded at
# once, so one output line can hold fragments of several ranks: "[1,1]<stdout>:rank 1[1,0]<stdout>:
# rank 0[1,1]<stdout>:" ends rank 1's line; rank 0's ends on a later one.
TAG = re.compile(r"\[(\d+),(\d+)\]<(stdout|stderr)>:")
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


class Demux:
    """mpirun's tagged output back into each rank's lines: fragments are kept per rank and
    stream until the fragment that ends an output line (the last one on it) completes them."""

    def __init__(self) -> None:
        self.partial: dict[tuple[int, str], str] = {}

    def feed(self, raw: str, stream: str) -> list[Line]:
        tags = list(TAG.finditer(raw))
        if not tags or tags[0].start() != 0:  # mpirun's own text
            return [Line(None, stream, raw)]
        out = []
        for i, m in enumerate(tags):
            key = (int(m.group(2)), m.group(3))
            end = tags[i + 1].start() if i + 1 < len(tags) else len(raw)
            self.partial[key] = self.partial.get(key, "") + raw[m.end() : end]
            if i + 1 == len(tags):  # the newline after the last fragment ends its line
                out.append(Line(key[0], key[1], self.partial.pop(key)))
        return out

    def rest(self) -> list[Line]:
        """Fragments never ended by a newline (a rank's last write), at the end of the output."""
        out = [Line(rank, stream, text) for (rank, stream), text in self.partial.items()]
        self.partial.clear()
        return out


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
        # srun prints strsignal(3): "Killed", "Segmentation fault" (+ " (core dumped)")
        sig = SIGNAL_TEXTS.get(cause.removesuffix(" (core dumped)"))
        return rank, f"killed by signal {int(sig)} ({sig.name}) on {node}" if sig else f"{cause} on {node}"
    return None


SRUN_NODE_FAILURE = re.compile(r"^srun: error: Node failure on (\S+)", re.MULTILINE)


def srun_node_failures(text: str) -> list[str]:
    """The nodes srun says failed under the step ("Node failure on n4": slurmctld took them down)."""
    return list(dict.fromkeys(SRUN_NODE_FAILURE.findall(text)))


def srun_reporting_nodes(text: str) -> set[str]:
    """The nodes srun reported a task of (an exit status, a signal, its own Terminated), less
    those it says failed: their step daemons answered, so they were alive when the step ended."""
    return {m.group(1) for m in SRUN_TASKS.finditer(text)} - set(SRUN_NODE_FAILURE.findall(text))


SIGNAL_TEXTS = {signal.strsignal(s): s for s in signal.Signals if signal.strsignal(s)}
