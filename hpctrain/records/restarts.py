"""Restarts after a failure (train.max_restarts): which failures a restart can outlive, and
restarts.jsonl, one line per restart, appended by whoever restarts the run (the local supervisor;
on SLURM, the rank that requeues the job). `status` and the summary read it.

A restart is for a world that broke, not for code that is wrong: a rank ended by a signal or lost
with its node (it wrote no error), a collective whose peer vanished, a stall, an injected fault.
An exception of the code or the configuration (a ValueError, an out-of-memory error) would be
raised again from the same checkpoint, so it is named and not retried (torchrun retries every
failure; its users then wait through N identical crashes).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

from hpctrain.records import (
    CHECKPOINTS,
    ErrorRecord,
    RecordError,
    error_file,
    first_error,
    is_peer_loss,
    keep_attempt,
    published_checkpoints,
    read,
    read_jsonl,
    result_written,
    steps_file,
)

RESTARTS = "restarts.jsonl"
ATTEMPT_VAR = "HPCTRAIN_ATTEMPT"  # the attempt a rank belongs to (0: the first), set by the launcher

# the error types that say the world broke under the ranks, not that their code is wrong
TRANSIENT = frozenset(
    {
        "CommError",  # hpctrain's: a collective or the world failed (engine/world.py)
        "Stalled",  # the stall watchdog's verdict on a rank
        "InjectedFailure",  # debug.fail_rank: a crash, on the first attempt only
        "DistBackendError",  # torch.distributed: NCCL/Gloo errors
        "DistNetworkError",
        "DistStoreError",
    }
)


@dataclass(frozen=True)
class Restart:
    """One restart: what failed, where, and what it cost."""

    attempt: int  # the attempt the restart begins (1: the first restart)
    time: float
    cause: str  # the failure as the report names it
    rank: int | None  # the rank that failed first (None: unknown)
    host: str | None
    failed_at_step: int  # steps the failed attempt had completed (rank 0's records)
    resumed_from: int  # the step the restart resumes from: its newest checkpoint's (0: none)
    nodes: int
    lost_s: float  # from the newest checkpoint (or the attempt's start) to the failure
    lost_nodes: list[str] = field(default_factory=list)  # nodes SLURM held lost after the failure
    change: str = ""  # what the restart changed: fewer ranks (train.elastic), or a requeue to full size
    # a start retried once after a rank died before the ranks met (not counted against
    # train.max_restarts: launch/slurm/restart.py:start_fault)
    start: bool = False

    @property
    def steps_redone(self) -> int:
        return max(0, self.failed_at_step - self.resumed_from)

    @property
    def node_hours_lost(self) -> float:
        return self.nodes * self.lost_s / 3600.0

    def describe(self) -> str:
        where = (
            f"rank {self.rank}" + (f" on {self.host}" if self.host else "") if self.rank is not None else ""
        )
        if self.start:
            return (
                f"start retried: {where + ': ' if where else ''}{self.cause.splitlines()[0]}; "
                "started again once (not counted against train.max_restarts)"
            )
        lost = f"node(s) {', '.join(self.lost_nodes)} lost; " if self.lost_nodes else ""
        return (
            f"restart {self.attempt}: {where + ': ' if where else ''}{self.cause.splitlines()[0]}; "
            f"{lost}{self.change + '; ' if self.change else ''}"
            f"resumed from step {self.resumed_from}, {self.steps_redone} step(s) redone, "
            f"{self.node_hours_lost:.4f} node-h lost"
        )


def not_restartable(error: ErrorRecord | None) -> str | None:
    """None when a restart may outlive the failure whose first error is `error` (None: the rank
    wrote none: it was killed or lost); else why a restart would fail again."""
    if error is None or error.type in TRANSIENT or is_peer_loss(error):
        return None
    return (
        f"not restarted: rank {error.rank} raised {error.type}, an error of the code or the "
        "configuration that a restart would raise again"
    )


def why_not(run_dir: Path, max_restarts: int, used: int) -> str | None:
    """None: restart the run that just failed (restarts left, and a failure a restart may
    outlive); else why not, as the failure report says it."""
    if used >= max_restarts:
        return f"not restarted: {used} restart(s) used of train.max_restarts={max_restarts}"
    if result_written(run_dir):
        return "not restarted: the run finished"
    return not_restartable(first_error(run_dir, causes_only=True))


def attempt(env: Mapping[str, str]) -> int:
    """This rank's attempt (0: the first): restarts after failures (the launcher's count) plus
    SLURM's requeues of the job (time limits, preemption)."""
    values = (env.get(var, "") for var in (ATTEMPT_VAR, "SLURM_RESTART_COUNT"))
    return sum(int(v) for v in values if v.isdigit())


def newest_checkpoint(run_dir: Path) -> tuple[int, float | None]:
    """(the step the newest checkpoint resumes at, when it was written), (0, None) without one.
    By name (train/checkpoint.py: checkpoints/step-NNNNNN.pt or .dcp), without reading it."""
    best: tuple[int, float | None] = (0, None)
    for p in published_checkpoints(run_dir / CHECKPOINTS):
        step = p.stem.removeprefix("step-")
        try:
            written = p.stat().st_mtime
        except OSError:
            continue
        if step.isdigit() and int(step) >= best[0]:
            best = (int(step), written)
    return best


def steps_done(run_dir: Path) -> int:
    """Steps rank 0 recorded (the failed attempt's and any before it)."""
    try:
        with open(run_dir / steps_file(0), "rb") as f:
            return sum(1 for line in f if line.endswith(b"\n"))
    except OSError:
        return 0


def set_aside(run_dir: Path) -> None:
    """The failed attempt's error files, kept as error-rank{R}.json.N: the next attempt's own
    failure (if any) is then the first error again."""
    for p in run_dir.glob("error-rank*.json"):
        keep_attempt(p)


def counted(done: list[Restart]) -> list[Restart]:
    """The restarts train.max_restarts counts: all but a retried start."""
    return [r for r in done if not r.start]


def record(run_dir: Path, r: Restart) -> None:
    """Append one restart (a whole line per write: a reader never sees half of one)."""
    line = json.dumps(asdict(r), sort_keys=True) + "\n"
    fd = os.open(run_dir / RESTARTS, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def read_restarts(run_dir: Path) -> list[Restart]:
    """restarts.jsonl; a damaged line is skipped (a writer killed mid-line)."""
    out = []
    for doc in read_jsonl(run_dir / RESTARTS):
        try:
            out.append(Restart(**doc))
        except TypeError:  # not a restart's fields
            continue
    return out


def restart_for(
    run_dir: Path,
    cause: str,
    rank: int | None,
    nodes: int,
    started: float,
    lost_nodes: list[str] | None = None,
    change: str = "",
    start: bool = False,
) -> Restart:
    """The restart that follows a failure (now) of the attempt that started at `started`, from
    what the run directory holds: the restarts before it, the newest checkpoint, rank 0's steps."""
    step, written = newest_checkpoint(run_dir)
    host = None
    try:
        if rank is not None:
            host = read(run_dir / error_file(rank), ErrorRecord).host
    except RecordError:
        host = None
    now = time.time()
    since = max(written or started, started)
    n = len(read_restarts(run_dir)) + 1
    return Restart(
        n,
        now,
        cause,
        rank,
        host,
        steps_done(run_dir),
        step,
        nodes,
        now - since,
        lost_nodes or [],
        change,
        start,
    )
