"""Stall detection for a user's script (script.stall_timeout_s): hpctrain cannot see a script's
steps unless it calls hpctrain.api.step, so a rank counts as making progress while it calls
api.step, writes output (stdout or stderr, through Python), or uses CPU (its main thread and every
process it started: at least 5% of a core). A rank with none of these for the timeout is
stalled: sleeping, deadlocked, or blocked on I/O that never completes. The rank's other threads
do not count: Horovod's background thread polls several times a millisecond and, counted, kept a
rank asleep in its script looking busy (a 10 s timeout named it after 48 s). A rank spinning in MPI
while it waits for a stalled peer uses CPU, and one whose main thread waits inside a collective
(hvd.allreduce, torch.distributed) is waiting for a peer: the peer is named, not it, unless every
idle rank waits in one (a deadlock: all are named). The report is the built-in trainer's (rank,
host, what it was doing, its Python stack; exit status 4)."""

from __future__ import annotations

import io
import os
import time
from pathlib import Path
from typing import Any, TextIO

from hpctrain import api
from hpctrain.lifeline import descendants, stat_fields
from hpctrain.train.watchdog import HEARTBEAT_S, Stalled, Watchdog, diagnose

DONE = "done"  # the heartbeat phase of a rank whose script has ended
CPU_SHARE = 0.05  # of one core, per heartbeat: more is progress
TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_s(stat_path: str) -> float:
    """utime + stime of a /proc stat file, in seconds; 0 once it is gone."""
    fields = stat_fields(stat_path)
    return 0.0 if fields is None else (int(fields[11]) + int(fields[12])) / TICK


def tree_cpu_s(pid: int) -> float:
    """CPU seconds used so far by `pid`'s main thread (its thread id is the pid) and by its live
    descendants, each whole (/proc/PID/task/PID/stat, /proc/CHILD/stat: utime + stime)."""
    return cpu_s(f"/proc/{pid}/task/{pid}/stat") + sum(cpu_s(f"/proc/{p}/stat") for p in descendants(pid))


class ScriptWatchdog(Watchdog):
    key = "script.stall_timeout_s"
    silence = "no api.step, output or CPU use"

    def __init__(self, run_dir: Path, rank: int, world: int, timeout_s: float) -> None:
        super().__init__(run_dir, rank, world, timeout_s)
        self.phase_name = "script"
        self.written = 0  # output writes seen by Noticing
        self._seen = (0, api._state.next_step, tree_cpu_s(os.getpid()))

    def start(self) -> ScriptWatchdog:
        self._beat()  # a heartbeat from the start: a rank whose script ends at once has one too
        super().start()
        return self

    def _beat_fields(self) -> dict[str, Any]:
        now = (self.written, api._state.next_step, tree_cpu_s(os.getpid()))
        wrote, stepped = now[0] != self._seen[0], now[1] != self._seen[1]
        if wrote or stepped or now[2] - self._seen[2] > CPU_SHARE * HEARTBEAT_S:
            self.progress = time.monotonic()
        if stepped:
            self.done = now[1] - 1
        self._seen = now
        return {**super()._beat_fields(), "idle": time.monotonic() - self.progress}

    def stop(self) -> None:
        """The script ended on this rank: a last heartbeat says so (the rank then waits for the
        others' results, which is not a stall)."""
        self.phase_name = DONE
        super().stop()
        self._beat()

    def _diagnose(self, beats: dict[int, dict[str, Any] | None]) -> list[Stalled]:
        """Unresponsive ranks as the trainer's watchdog names them; else the ranks idle for at
        least half the timeout (a peer spinning in MPI is not idle). Ranks whose script ended
        are neither."""
        now = time.time()
        beats = {
            r: {**b, "time": now, "idle": 0.0} if b and b["phase"] == DONE else b for r, b in beats.items()
        }
        base = diagnose(beats, self.world, now)
        if any(not s.responsive for s in base):
            return base
        idle = [
            (r, b)
            for r, b in beats.items()
            if b is not None and float(b.get("idle", 0)) >= self.timeout_s / 2
        ]
        holding = [(r, b) for r, b in idle if not b.get("collective")]  # not waiting for a peer
        idle = holding or idle
        return [
            Stalled(
                r,
                b["host"],
                f"in its script for {float(b['idle']):.0f} s without output, api.step or CPU use",
                True,
            )
            for r, b in sorted(idle, key=lambda rb: rb[0])
        ] or base


class PassThrough(io.TextIOBase):
    """A text stream that hands everything to `out` (subclasses look at what is written)."""

    def __init__(self, out: TextIO) -> None:
        self.out = out

    def write(self, text: str) -> int:
        return self.out.write(text)

    def flush(self) -> None:
        self.out.flush()

    def fileno(self) -> int:
        return self.out.fileno()

    def isatty(self) -> bool:
        return self.out.isatty()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return self.out.encoding

    @property
    def errors(self) -> str | None:  # type: ignore[override]
        return self.out.errors

    @property
    def buffer(self) -> _Bytes:
        """sys.stdout.buffer, as scripts that write raw bytes use it."""
        return _Bytes(self)

    def saw_bytes(self) -> None:
        """Bytes written past the text layer (subclasses may count them)."""


class _Bytes:
    """The binary stream under a PassThrough: text written before the bytes comes out first."""

    def __init__(self, text: PassThrough) -> None:
        self.text = text

    def write(self, data: bytes) -> int:
        self.text.out.flush()
        self.text.saw_bytes()
        return self.text.out.buffer.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.text.out.buffer, name)


class Noticing(PassThrough):
    """A stream passed through, each write counted as the script's progress."""

    def __init__(self, out: TextIO, watch: ScriptWatchdog) -> None:
        super().__init__(out)
        self.watch = watch

    def write(self, text: str) -> int:
        self.watch.written += 1
        return self.out.write(text)

    def saw_bytes(self) -> None:
        self.watch.written += 1
