"""Optional instrumentation for your own training script (`hpctrain run script=train.py`).

A script that calls these gets what the built-in trainer has: per-step records
(steps-rank{R}.jsonl), summary.json, scaling studies, and on SLURM a checkpoint-and-requeue at the
time limit that resumes where it stopped. Outside hpctrain every call is a cheap no-op (None,
False), so the script still runs with torchrun, horovodrun or plain python::

    from hpctrain import api

    state = api.load_checkpoint()                 # None on a fresh start
    start = state["step"] if state else 0
    for step in range(start, steps):
        ... one optimizer step on this rank's batch ...
        api.step(samples=len(batch), loss=loss.item())
        if api.should_stop():                     # every rank, every step: a collective vote
            api.save_checkpoint({"step": step + 1, "model": model.state_dict(), ...})
            break                                 # hpctrain requeues the job; it resumes here

All ranks must call should_stop() at the same steps (it agrees over the script's own
torch.distributed group or Horovod). save_checkpoint writes from rank 0 only, atomically.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import IO, Any

__all__ = [
    "run_dir",
    "rank",
    "batch_per_rank",
    "global_batch",
    "steps",
    "start_timer",
    "step",
    "should_stop",
    "save_checkpoint",
    "load_checkpoint",
    "request_stop",
]

RUN_DIR_VAR = "HPCTRAIN_RUN_DIR"


class _State:
    def __init__(self) -> None:
        self.stop_requested = False  # set by hpctrain's SIGUSR2 handler (SLURM time limit)
        self.stopped = False  # should_stop() returned True: the script is leaving to be requeued
        self.next_step = 0
        self.last: float | None = None
        self.file: IO[str] | None = None
        self.steps: list[Any] = []  # this attempt's and the kept earlier StepRecords
        self.warmup = 0
        self.global_batch = 0


_state = _State()


def run_dir() -> Path | None:
    """This run's directory under hpctrain (None outside it)."""
    d = os.environ.get(RUN_DIR_VAR)
    return Path(d) if d else None


def rank() -> int:
    """This process's rank (0 outside hpctrain, or where no launcher set one)."""
    from hpctrain.engine.world import launcher_rank

    return launcher_rank(os.environ) or 0


def batch_per_rank() -> int | None:
    """The per-rank batch hpctrain planned (train.batch_per_rank / global_batch): a study's scale."""
    v = os.environ.get("HPCTRAIN_BATCH_PER_RANK")
    return int(v) if v else None


def global_batch() -> int | None:
    """The global batch hpctrain planned (train.global_batch; a weak-scaling study grows it)."""
    v = os.environ.get("HPCTRAIN_GLOBAL_BATCH")
    return int(v) if v else None


def steps() -> int | None:
    """The optimizer steps hpctrain planned (train.steps; a study sets it per point)."""
    v = os.environ.get("HPCTRAIN_STEPS")
    return int(v) if v else None


def start_timer() -> None:
    """Start the clock of the first step (else it runs from the script's start)."""
    _state.last = time.perf_counter()


def step(
    samples: int,
    loss: float | None = None,
    compute_s: float | None = None,
    comm_s: float | None = None,
    data_s: float | None = None,
    lr: float | None = None,
) -> None:
    """Record one optimizer step of this rank: `samples` it processed, its loss, and if the script
    measures them, the compute / exposed-communication / data-wait split (else NaN: unknown)."""
    d = run_dir()
    if d is None:
        return
    from hpctrain import records

    now = time.perf_counter()
    if _state.file is None:
        _open(d)
    step_s = now - (_state.last if _state.last is not None else now)
    _state.last = now
    n = _state.next_step
    _state.next_step += 1
    nan = float("nan")
    rec = records.StepRecord(
        step=n,
        rank=rank(),
        loss=float(loss) if loss is not None else nan,
        lr=float(lr) if lr is not None else nan,
        data_s=float(data_s) if data_s is not None else nan,
        compute_s=float(compute_s) if compute_s is not None else nan,
        comm_s=float(comm_s) if comm_s is not None else nan,
        step_s=step_s,
        samples=int(samples),
        samples_per_s=_state.global_batch / step_s if step_s > 0 and _state.global_batch else nan,
        timed=n >= _state.warmup,
    )
    _state.steps.append(rec)
    if _state.file is not None:
        _state.file.write(records.step_line(rec))


def _open(d: Path) -> None:
    from hpctrain import records

    path = d / records.steps_file(rank())
    _state.steps = records.resume_steps(path, _state.next_step)
    _state.file = open(path, "w", buffering=1)  # noqa: SIM115 - open for the script's lifetime
    _state.file.writelines(records.step_line(r) for r in _state.steps)
    _state.warmup = int(os.environ.get("HPCTRAIN_WARMUP_STEPS", "0"))
    _state.global_batch = global_batch() or 0
    if _state.last is None:
        _state.last = time.perf_counter()


def should_stop() -> bool:
    """True on every rank once a stop was requested on any (SLURM's signal before the time limit,
    or preemption): save a checkpoint and leave the training loop. A collective call."""
    if run_dir() is None:
        return False
    if not _state.stopped and _agree(_state.stop_requested):
        _state.stopped = True
    return _state.stopped


def _agree(flag: bool) -> bool:
    import sys

    import torch

    t = torch.tensor([1.0 if flag else 0.0])
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        if dist.get_backend() == "nccl":
            t = t.cuda()
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t.item() > 0)
    hvd = sys.modules.get("horovod.torch")
    if hvd is not None and hvd.is_initialized():
        return bool(hvd.allreduce(t, op=hvd.Max, name="hpctrain.api.stop").item() > 0)
    return flag


def save_checkpoint(state: dict[str, Any]) -> Path | None:
    """Rank 0 writes `state` (which must hold "step": the step to resume at) atomically; other
    ranks return None. Keeps the two newest; `latest` always names a complete one."""
    d = run_dir()
    if d is None or rank() != 0:
        return None
    from hpctrain.train import checkpoint

    if not isinstance(state.get("step"), int):
        raise ValueError('api.save_checkpoint: the state needs "step" (int), the step to resume at')
    return checkpoint.write(d, state["step"], state)


def load_checkpoint() -> dict[str, Any] | None:
    """The newest usable checkpoint's state (every rank reads it), or None on a fresh start.
    Step records continue from its "step"."""
    d = run_dir()
    if d is None:
        return None
    from hpctrain.train import checkpoint

    found = checkpoint.newest(d, ("step",))
    if found is None:
        return None
    path, state, skipped = found
    if rank() == 0:
        for note in skipped:
            print(f"checkpoint skipped: {note}", flush=True)
        print(f"resuming from {path} at step {state['step']}", flush=True)
    _state.next_step = int(state["step"])
    return state


def request_stop() -> None:
    """hpctrain's side: the launcher's stop signal arrived (should_stop() will agree on it)."""
    _state.stop_requested = True


def _finish() -> list[Any]:
    """hpctrain's side, when the script has returned: close the records, hand them back."""
    if _state.file is not None:
        _state.file.close()
        _state.file = None
    return _state.steps
