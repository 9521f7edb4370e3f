"""The driver every rank runs around the training step, readable top to bottom: build or
restore the trainer, then per step: wait for data, step, record, report, and checkpoint or stop
when the ranks agree to (SLURM time limits and preemption)."""

from __future__ import annotations

import io
import math
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch.utils.data import TensorDataset

from hpctrain import heap, records
from hpctrain.config.derived import Derived
from hpctrain.config.schema import Config
from hpctrain.engine.world import RankInfo
from hpctrain.events import format_event
from hpctrain.records.parts import StepParts
from hpctrain.records.restarts import attempt
from hpctrain.train import checkpoint
from hpctrain.train.compile import compile_seconds
from hpctrain.train.data import held_out, holds_out
from hpctrain.train.memory import peak_bytes, reset_peak
from hpctrain.train.objective import logits_of
from hpctrain.train.profile import attach
from hpctrain.train.schedule import lr_at
from hpctrain.train.setup import Build, build_model, prepare
from hpctrain.train.stats import rank_stats
from hpctrain.train.step import StepInput, StepResult, Trainer
from hpctrain.train.stop import StopControl

if TYPE_CHECKING:
    from hpctrain.engine.base import Engine


class NonFiniteLoss(RuntimeError):
    """The loss became NaN or infinite: training on would only produce garbage."""


class InjectedFailure(RuntimeError):
    """Raised by the debug.fail_rank / debug.fail_step fault injection."""


def place_batch(cfg: Config, x: torch.Tensor, device: torch.device) -> torch.Tensor:
    x = x.to(device, non_blocking=True)
    if cfg.model.channels_last and x.dim() == 4:
        x = x.contiguous(memory_format=torch.channels_last)
    return x


def train(
    cfg: Config,
    engine: Engine,
    info: RankInfo,
    d: Derived,
    run_dir: Path,
    build: Build,
    emit: Callable[[str], None] = print,
    control: StopControl | None = None,
) -> records.RankSummary | None:
    """Run cfg.train.steps steps with the trainer the parallelism `build`s (parallel/*.py:
    ParallelismKind.build); return this rank's summary, or None if stopped by `control` (after a
    checkpoint). Rank 0 also logs and reports."""
    setup = prepare(cfg, engine, info, d, run_dir)
    t, restored = build(setup)
    notes = list(setup.notes)  # with what the build said (train.compile's blocks)
    heap.release()  # the collector held since the rank started (hpctrain/heap.py)
    master = info.rank == 0
    if master:
        for note in notes:
            emit(note)
        for note in restored.skipped:
            emit(f"checkpoint skipped: {note}")
        if restored.path is not None:
            n = checkpoint.writers(restored.path)
            moved = f" (written by {n} ranks, resharded to {d.world_size})" if n and n != d.world_size else ""
            emit(f"resuming from {restored.path} at step {restored.step}{moved}")
        if restored.step >= cfg.train.steps:
            emit(
                f"note: nothing left to train: the checkpoint is at step {restored.step} and "
                f"train.steps={cfg.train.steps}; raise train.steps to train on"
            )
    t.train_mode()
    reset_peak(t.device)  # the peak of training, not of building (a pipeline traces the whole model)
    t.watch.completed(-1)  # built: the timeout counts from the first step on
    prof = attach(cfg, info.rank, run_dir, engine, t.watch)  # profile.*: None unless this rank profiles
    out = _steps(t, Place(info.rank, d, run_dir), restored.step, emit, control)
    t.watch.stop()
    if prof is not None:
        prof.close()
    if out is None:
        return None
    probe, wait = t.after_training(out, d.world_size, info.rank)
    test = holds_out(cfg.data)
    accuracy: float | None = None
    if cfg.train.save_model or test:
        weights = t.whole_model_state()  # collective: every rank calls it
        if master and cfg.train.save_model:
            buf = io.BytesIO()
            torch.save(weights, buf)
            records.write_atomic(run_dir / records.MODEL, buf.getvalue())
        if master and test:
            accuracy = evaluate(cfg, d, weights, held_out(cfg.data))
    return rank_stats(
        out,
        info.rank,
        info.hostname,
        peak_bytes(t.device),
        t.parameters,
        threads=torch.get_num_threads(),
        grad_tensors=t.grad_tensors(),
        probe=probe,
        wait_s=wait,
        held=t.held_bytes(),
        figures=t.figures(),
        accuracy=accuracy,
        topology=os.environ.get("SLURM_TOPOLOGY_ADDR", ""),
        compile_s=compile_seconds(),
    )


def evaluate(cfg: Config, d: Derived, weights: dict[str, torch.Tensor], test: TensorDataset) -> float | None:
    """The share of `test` the whole trained model classifies right: a fresh copy of the model on
    the CPU with the gathered weights (whatever the parallelism), in fp32, in evaluation mode;
    None for a model whose output holds no logits (called without targets: objective.logits_of)."""
    model, _ = build_model(cfg, d, torch.device("cpu"))  # on the meta device where sharded: assign
    model.load_state_dict({k: v.detach().to("cpu", torch.float32) for k, v in weights.items()}, assign=True)
    model.eval()
    x, y = test.tensors
    right = 0
    with torch.no_grad():
        for xb, yb in zip(x.split(256), y.split(256)):
            logits = logits_of(model(xb))
            if logits is None:
                return None
            right += int((logits.argmax(-1) == yb).sum())
    return right / len(y)


@dataclass(frozen=True)
class Place:
    """Where this rank's steps are recorded: its rank, the run's derived quantities, its directory."""

    rank: int
    d: Derived
    run_dir: Path


def _steps(
    t: Trainer, at: Place, start: int, emit: Callable[[str], None], control: StopControl | None
) -> list[records.StepRecord] | None:
    """The steps from `start` on, each recorded as it completes; None when every rank agreed to
    stop (after a checkpoint)."""
    cfg, engine, d, run_dir, rank = t.cfg, t.engine, at.d, at.run_dir, at.rank
    master, last_event = rank == 0, 0.0
    steps_path = run_dir / records.steps_file(rank)
    out = records.resume_steps(steps_path, start)
    t.watch.phase("data", start)
    # line by line: status sees progress, and a rank killed by a signal loses no record (a buffer
    # of a quarter second's records lost them: 12 suite tests failed, issue 74)
    with open(steps_path, "w", buffering=1) as steps_file:
        steps_file.writelines(records.step_line(r) for r in out)
        t_prev = time.perf_counter()
        for step, (x, y) in enumerate(t.loader, start=start):
            _debug_hooks(cfg, rank, step, start, t, control, emit if master else None)
            x, y = place_batch(cfg, x, t.device), y.to(t.device, non_blocking=True)
            # the copies are queued on the compute stream before this mark, so the copy to the
            # device is part of the data wait, which ends when the device reaches it (the step
            # reads that once it has settled: StepResult.began)
            arrived = t.clock.mark()
            lr = lr_at(step, cfg.optim, d.lr)
            vote = control.requested if control is not None else None
            r = t.train_step(StepInput(x, y, lr, step, vote, arrived))
            t.watch.phase("data", step + 1)  # what follows counts as the next step's data wait
            rec = _record(cfg, at, step, lr, r, t_prev)
            t_prev = r.end
            out.append(rec)
            steps_file.write(records.step_line(rec))
            t.watch.completed(step)
            if step + 1 == cfg.train.warmup_steps:  # the peak of the timed steps, as their times:
                reset_peak(t.device)  # the first step's lazy imports and kernel choice are not the model's
            if cfg.train.stop_on_nonfinite_loss and not math.isfinite(r.loss):
                raise NonFiniteLoss(
                    f"the loss is {r.loss} at step {step} on rank {rank} (lr {lr:g}); lower "
                    "optim.lr or use a wider precision, or set train.stop_on_nonfinite_loss=false"
                )
            last_event = _report(cfg, rec, emit, last_event, master)
            if control is not None:
                if _checkpoint_due(cfg, control, step, r.stop):
                    steps_file.flush()
                    path = t.save_checkpoint(run_dir, step + 1, master)
                    if path is not None:
                        emit(f"checkpoint {path.name} written after step {step + 1}")
                    engine.barrier(f"hpctrain.ckpt.{step}")  # all wait for it
                if r.stop:
                    return None
    return out


def _checkpoint_due(cfg: Config, control: StopControl, step: int, stop: bool) -> bool:
    """When stopping, and every checkpoint_interval steps before the last."""
    every = control.checkpoint_interval
    return stop or bool(every and (step + 1) % every == 0 and step + 1 < cfg.train.steps)


def _record(cfg: Config, at: Place, step: int, lr: float, r: StepResult, t_prev: float) -> records.StepRecord:
    d = at.d
    return records.StepRecord(
        step=step,
        rank=at.rank,
        loss=r.loss,
        lr=lr,
        data_s=max(0.0, r.began - t_prev),  # 0 at worst: both host times read as the device settled
        compute_s=r.compute_s,
        comm_s=r.comm_s,
        step_s=r.end - t_prev,
        samples=d.batch.per_rank,
        samples_per_s=d.batch.global_ / (r.end - t_prev),
        timed=step >= cfg.train.warmup_steps,
        parts=StepParts(r.parts),
    )


def _debug_hooks(
    cfg: Config,
    rank: int,
    step: int,
    start: int,
    t: Trainer,
    control: StopControl | None,
    emit: Callable[[str], None] | None,
) -> None:
    """debug.hold_step and debug.fail_rank/fail_step, before the step, on the first attempt only
    (a restart or a requeue then goes on past them)."""
    if step == cfg.debug.hold_step and start == 0 and control is not None:
        t.watch.phase("hold", step)
        _hold(control, step, emit)
    at_step = cfg.debug.fail_mode != "start_segfault"  # that one fails before the first step
    if at_step and cfg.debug.fail_rank == rank and step == cfg.debug.fail_step and attempt(os.environ) == 0:
        _inject_failure(cfg.debug.fail_mode, rank, step)


def _report(
    cfg: Config, rec: records.StepRecord, emit: Callable[[str], None], last_event: float, master: bool
) -> float:
    """Every rank: a line into its own log every log_interval steps, naming the rank whose loss it
    shows (`hpctrain logs --rank N`; the run's console follows rank 0's). Rank 0: progress events
    at most 5 times a second."""
    step, steps = rec.step, cfg.train.steps
    now = time.monotonic()
    done = step + 1 == steps
    if (step + 1) % cfg.train.log_interval == 0 or done:
        emit(
            f"step {step + 1}/{steps}  loss {rec.loss:.4f} (rank {rec.rank})  lr {rec.lr:.4g}  "
            f"step {1e3 * rec.step_s:.1f} ms (compute {1e3 * rec.compute_s:.1f}, "
            f"comm {1e3 * rec.comm_s:.1f}, data {1e3 * rec.data_s:.1f})  {rec.samples_per_s:.0f} samples/s"
        )
    if not master:
        return last_event
    if done or now - last_event >= 0.2:
        emit(
            format_event(
                "progress", step=step + 1, steps=steps, loss=rec.loss, samples_per_s=rec.samples_per_s
            )
        )
        return now
    return last_event


def _hold(control: StopControl, step: int, emit: Callable[[str], None] | None) -> None:
    """debug.hold_step: wait here until a stop is requested (SIGUSR2), so a test's signal is
    certain to reach the job mid-run; give up after 10 minutes."""
    if emit is not None:
        emit(f"holding at step {step} until a stop is requested (debug.hold_step)")
    deadline = time.monotonic() + 600
    while not control.requested and time.monotonic() < deadline:
        time.sleep(0.05)


def start_fault(cfg: Config, rank: int | None) -> None:
    """debug.fail_mode=start_segfault: this rank dies of SIGSEGV before the ranks meet, on the
    first attempt only, as a rank in MPI's start does (without a core file)."""
    d = cfg.debug
    if d.fail_mode == "start_segfault" and d.fail_rank == rank and attempt(os.environ) == 0:
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        signal.signal(signal.SIGSEGV, signal.SIG_DFL)  # past faulthandler, if it is on
        os.kill(os.getpid(), signal.SIGSEGV)


def _inject_failure(mode: str, rank: int, step: int) -> None:
    if mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    raise InjectedFailure(f"injected failure on rank {rank} at step {step} (debug.fail_rank/fail_step)")
