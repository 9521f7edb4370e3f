"""Stall detection: a watchdog thread in every rank (train.stall_timeout_s).

Each rank's thread writes heartbeat-rank{R}.json once a second: its last completed step and the
phase it is in (data, compute, comm, optimizer) since when. When no step has completed on this
rank for the timeout, one rank (the first to create stall.json) asks every rank for its Python
stack, waits two heartbeats, diagnoses from the heartbeats which rank(s) hold the others up,
writes error-rank{R}.json for the first of them and exits; the launcher then stops the rest
(mpirun, or srun --kill-on-bad-exit), and reports it like any failed rank.

    a rank whose heartbeat stopped     stopped (SIGSTOP), or hung outside Python: its stack is
                                       read with py-spy when it runs on this host
    a rank not waiting in comm         hung in its own work (data loading, I/O, a deadlock)
    every rank waiting in comm         a collective that cannot complete: all are named

In synchronous data parallelism no rank gets more than one step ahead of the others, so the
time since the last completed step is the measure; "N steps behind" cannot happen.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from hpctrain import records

HEARTBEAT_S = 1.0
STALE_S = 5.0  # a heartbeat older than this: the rank's process is not running


@dataclass(frozen=True)
class Stalled:
    rank: int
    host: str
    why: str  # e.g. "in compute of step 5 for 12 s (last completed step 4)"
    responsive: bool  # its heartbeat is current (so it could report its own stack)


def diagnose(beats: dict[int, dict[str, Any] | None], world: int, now: float) -> list[Stalled]:
    """The ranks holding the run up, from every rank's latest heartbeat (None: none yet)."""
    out = []
    for r in range(world):
        b = beats.get(r)
        if b is None or now - float(b["time"]) > STALE_S:
            age = "never" if b is None else f"{now - float(b['time']):.0f} s ago"
            last = (
                "" if b is None else f", last completed step {b['done']}, in {b['phase']} of step {b['step']}"
            )
            out.append(
                Stalled(
                    r,
                    b["host"] if b else "?",
                    f"no heartbeat ({age}): stopped, or hung outside Python{last}",
                    False,
                )
            )
    if out:
        return out
    current = {r: b for r, b in beats.items() if b is not None}  # every rank's, by now
    busy = [r for r in range(world) if not waits(current[r])]
    for r in busy or range(world):
        b = beats[r]
        assert b is not None
        waiting = "" if busy else " (every rank waits in communication)"
        out.append(
            Stalled(
                r,
                b["host"],
                f"in {b['phase']} of step {b['step']} for {now - float(b['since']):.0f} s ({_done(b)}){waiting}",
                True,
            )
        )
    return out


# torch.distributed: FSDP's unshard and reduce-scatter, pipelining's p2p; Horovod: a script's
# hvd.allreduce waiting in synchronize (its collectives' Python side)
COLLECTIVE_CODE = ("/torch/distributed/", "/horovod/")
TORCH_CODE = "/torch/"


def in_collective(frame: FrameType | None) -> bool:
    """Whether the main thread waits in a collective right now: FSDP all-gathers and
    reduce-scatters inside forward and backward, and a pipeline receives inside its schedule, so
    the phase alone ("compute") does not tell a rank waiting for a peer from one at work. From
    the innermost frame out, torch.distributed's or Horovod's code decides, unless other code than
    torch's (the trainer's, the user's) is at work first: a stage's backward runs inside the
    schedule too."""
    while frame is not None:
        name = frame.f_code.co_filename
        if any(code in name for code in COLLECTIVE_CODE):
            return True
        if TORCH_CODE not in name and not name.startswith("<"):
            return False
        frame = frame.f_back
    return False


def waits(beat: dict[str, Any]) -> bool:
    """A rank waiting for the others (in the comm phase, or inside a collective), not holding them up."""
    return beat["phase"] == "comm" or bool(beat.get("collective"))


def _done(beat: dict[str, Any]) -> str:
    return "no step completed yet" if int(beat["done"]) < 0 else f"last completed step {beat['done']}"


class Watchdog:
    key = "train.stall_timeout_s"
    silence = "no step completed"

    def __init__(self, run_dir: Path, rank: int, world: int, timeout_s: float) -> None:
        self.run_dir, self.rank, self.world, self.timeout_s = run_dir, rank, world, timeout_s
        self.host = socket.gethostname()
        self.step, self.done, self.phase_name, self.since = 0, -1, "start", time.time()
        self.progress = time.monotonic()
        self.main = threading.main_thread().ident
        self._stop = threading.Event()
        self.listener: Callable[[str, int], None] | None = None  # told every phase (the profiler)

    # --- called by the training loop (attribute writes only: no I/O on the hot path) --------
    def phase(self, name: str, step: int) -> None:
        self.phase_name, self.step, self.since = name, step, time.time()
        if self.listener is not None:
            self.listener(name, step)

    def completed(self, step: int) -> None:
        self.done, self.progress = step, time.monotonic()

    def start(self) -> Watchdog:
        threading.Thread(target=self._run, name="hpctrain-watchdog", daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()

    # --- the thread -------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            self._beat()
            if (self.run_dir / records.STALL).exists() and not (
                self.run_dir / records.stack_file(self.rank)
            ).exists():
                self._dump_flight()
                records.write_atomic(self.run_dir / records.stack_file(self.rank), self._own_stack())
            if self.phase_name == "hold":  # debug.hold_step waits on purpose
                self.progress = time.monotonic()
            if self.timeout_s and time.monotonic() - self.progress > self.timeout_s:
                self._report()

    def _beat(self) -> None:
        records.write_json(self.run_dir / records.heartbeat_file(self.rank), self._beat_fields())

    def _beat_fields(self) -> dict[str, Any]:
        return dict(
            rank=self.rank,
            host=self.host,
            pid=os.getpid(),
            step=self.step,
            done=self.done,
            phase=self.phase_name,
            since=self.since,
            time=time.time(),
            collective=in_collective(sys._current_frames().get(self.main or 0)),
        )

    def _diagnose(self, beats: dict[int, dict[str, Any] | None]) -> list[Stalled]:
        return diagnose(beats, self.world, time.time())

    def _own_stack(self) -> str:
        frame = sys._current_frames().get(self.main or 0)
        return "".join(traceback.format_stack(frame)) if frame is not None else "(no Python frame)\n"

    def _report(self) -> None:
        try:  # one rank reports; the others go on waiting for the launcher to end them
            fd = os.open(self.run_dir / records.STALL, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:  # another rank reports: this one says where it is, then waits
            self._dump_flight()
            records.write_atomic(self.run_dir / records.stack_file(self.rank), self._own_stack())
            self._stop.set()
            return
        os.close(fd)
        found = time.time()  # when this rank saw the stall (stall.json says so: how long detection took)
        self._dump_flight()
        records.write_atomic(self.run_dir / records.stack_file(self.rank), self._own_stack())
        time.sleep(2.5 * HEARTBEAT_S)  # every other live rank writes its stack
        # this thread beat before the sleep: on a loaded node its own beat could read stale by
        # now, and the reporter would name itself stopped (seen: "no heartbeat (7 s ago)")
        self._beat()
        beats = {r: _read_json(self.run_dir / records.heartbeat_file(r)) for r in range(self.world)}
        stalled = self._diagnose(beats)
        stacks = [self._stack_of(s, beats.get(s.rank)) for s in stalled]
        first = stalled[0]
        names = "; ".join(f"rank {s.rank} on {s.host} {s.why}" for s in stalled)
        message = f"{self.silence} for {self.timeout_s:g} s ({self.key}); stalled: {names}"
        flight = self._flight_lines()
        if flight:
            message += "\nflight recorder (the last collective each rank entered):\n  " + "\n  ".join(flight)
        text = "\n".join(f"Python stack of rank {s.rank}:\n{st}" for s, st in zip(stalled, stacks))
        records.write_json(
            self.run_dir / records.STALL,
            {"message": message, "stalled": [s.__dict__ for s in stalled], "found": found, "flight": flight},
        )
        print(f"hpctrain: {message}", file=sys.stderr, flush=True)
        records.write_json(
            self.run_dir / records.error_file(first.rank),
            {
                "rank": first.rank,
                "host": first.host,
                "type": "Stalled",
                "message": message + "\n" + text,
                "traceback": text,
                "time": time.time(),
            },
        )
        os._exit(1)

    def _dump_flight(self) -> None:
        """This rank's flight recorder (torch.distributed's last collectives), if it has one: the
        ranks enable it (rank.py: TORCH_FR_BUFFER_SIZE) and meet over torch.distributed."""
        try:
            import torch.distributed as dist

            if not (dist.is_available() and dist.is_initialized()):
                return
            import torch._C._distributed_c10d as c10d

            # not in torch's stubs; torch/distributed/flight_recorder reads the same dump
            dump = getattr(c10d, "_dump_fr_trace_json")(includeCollectives=True, onlyActive=False)  # noqa: B009
        except (ImportError, RuntimeError, AttributeError):
            return
        records.write_atomic(self.run_dir / records.flight_file(self.rank), dump)

    def _flight_lines(self) -> list[str]:
        from hpctrain.analysis.flight import hang_lines

        dumps = {}
        for r in range(self.world):
            d = _read_json(self.run_dir / records.flight_file(r))
            if d is not None:
                dumps[r] = d
        return hang_lines(dumps, self.world) if dumps else []

    def _stack_of(self, s: Stalled, beat: dict[str, Any] | None) -> str:
        own = _read_text(self.run_dir / records.stack_file(s.rank))
        if own:
            return own
        spy = _py_spy()
        said = ""
        if beat and beat.get("host") == self.host and spy:
            # a stopped process's memory can still be read (--nonblocking: no ptrace stop); a read
            # can fail while the machine is loaded (a suite run once lost the stack): try again
            for _ in range(SPY_TRIES):
                try:
                    r = subprocess.run(
                        [spy, "dump", "--nonblocking", "--pid", str(beat["pid"])],
                        capture_output=True,
                        text=True,
                        timeout=20,
                    )
                except (OSError, subprocess.TimeoutExpired) as e:
                    said = str(e)
                    continue
                if r.returncode == 0 and r.stdout.strip():
                    return r.stdout
                lines = (r.stderr or r.stdout).strip().splitlines()
                said = lines[-1] if lines else f"exit status {r.returncode}"
        why = f" (py-spy: {said[:200]})" if said else ""
        return f"(not available: the rank did not answer, and py-spy could not read it{why})\n"


SPY_TRIES = 3  # py-spy reads of a stalled rank's stack before giving up


def _py_spy() -> str | None:
    """py-spy from this interpreter's environment (a venv's bin/ is often not on PATH), else PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.is_file() else shutil.which("py-spy")


def _read_json(path: Path) -> dict[str, Any] | None:
    """A heartbeat, or None if there is none (yet) or it cannot be read."""
    try:
        data = records.read_json(path)
    except records.RecordError:
        return None
    return data if isinstance(data, dict) else None


def _read_text(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""
