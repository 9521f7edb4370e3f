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
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict, cast

import torch
from torch import nn

from hpctrain import records
from hpctrain.config.derived import Derived
from hpctrain.config.layout import SHARDED, layout_for
from hpctrain.config.schema import Config
from hpctrain.engine.base import StageReplicas
from hpctrain.engine.clock import Clock, clock_for
from hpctrain.engine.device import current_device
from hpctrain.engine.world import CommError, RankInfo
from hpctrain.events import format_event
from hpctrain.parallel.split import declared_checkpoint_blocks
from hpctrain.train import checkpoint, optim
from hpctrain.train.data import GlobalBatchSampler, build_loader
from hpctrain.train.memory import peak_bytes, reset_peak
from hpctrain.train.parts import make_criterion, make_dataset, make_model, workload_label
from hpctrain.train.pipeline import checkpoint_blocks
from hpctrain.train.pipeline_step import PipelineTrainer
from hpctrain.train.precision import make_scaler
from hpctrain.train.profile import attach
from hpctrain.train.schedule import lr_at
from hpctrain.train.shard import sharded_trainer
from hpctrain.train.stats import rank_stats
from hpctrain.train.step import DataParallelTrainer, StepInput, StepResult, Trainer
from hpctrain.train.targets import probe
from hpctrain.train.watchdog import Watchdog

if TYPE_CHECKING:
    from hpctrain.engine.base import Engine


class NonFiniteLoss(RuntimeError):
    """The loss became NaN or infinite: training on would only produce garbage."""


class InjectedFailure(RuntimeError):
    """Raised by the debug.fail_rank / debug.fail_step fault injection."""


@dataclass
class StopControl:
    """Cooperative stop for preemption and time limits (SLURM).

    A signal handler sets `requested`; at every step the ranks agree on it (train_step's vote),
    so all stop after the same step. Rank 0 then writes a checkpoint, and the caller requeues.
    """

    requested: bool = False
    checkpoint_interval: int = 0  # also checkpoint every N steps (0: only when stopping)


def place_model(cfg: Config, model: nn.Module, device: torch.device) -> nn.Module:
    """On the device, in the memory format the config asks for (NHWC for model.channels_last)."""
    model = model.to(device)
    if cfg.model.channels_last and cfg.data.name != "tokens":
        # Module.to takes memory_format (torch docs); its type stubs leave the keyword out
        model = cast(Any, model).to(memory_format=torch.channels_last)
    return model


def place_batch(cfg: Config, x: torch.Tensor, device: torch.device) -> torch.Tensor:
    x = x.to(device, non_blocking=True)
    if cfg.model.channels_last and x.dim() == 4:
        x = x.contiguous(memory_format=torch.channels_last)
    return x


def make_optimizer(cfg: Config, model: nn.Module, lr: float) -> torch.optim.Optimizer:
    o = cfg.optim
    if o.name == "adamw":
        return optim.AdamW(
            model.parameters(), lr=lr, betas=(o.betas[0], o.betas[1]), weight_decay=o.weight_decay
        )
    return optim.SGD(model.parameters(), lr=lr, momentum=o.momentum, weight_decay=o.weight_decay)


class Common(TypedDict):
    """What both trainers are built with."""

    device: torch.device
    clock: Clock
    criterion: nn.Module
    watch: Watchdog
    parameters: int
    delay_s: float


def build_trainer(
    cfg: Config, engine: Engine, info: RankInfo, d: Derived, run_dir: Path
) -> tuple[Trainer, checkpoint.Restored]:
    """Model, optimizer and data, restored from the latest checkpoint if there is one."""
    device = current_device(cfg.train.device)  # bound by the rank entry, before the engine started
    # watched from the start: a model or dataset constructor (the user's _target_) may hang too
    watch = Watchdog(run_dir, info.rank, d.world_size, cfg.train.stall_timeout_s)
    watch.phase("build", 0)
    watch.start()
    torch.manual_seed(cfg.train.seed)  # identical initial weights everywhere; broadcast makes sure
    module = place_model(cfg, make_model(cfg), device)
    layout = layout_for(cfg, d.world_size)
    criterion = make_criterion(cfg)
    dataset = make_dataset(cfg, d.batch.global_)
    if cfg.user_code:
        probe(module, criterion, dataset, device, workload_label(cfg))
    common = Common(
        device=device,
        clock=clock_for(device),
        criterion=criterion,
        watch=watch,
        parameters=sum(p.numel() for p in module.parameters()),
        delay_s=cfg.debug.slow_s if cfg.debug.slow_rank == info.rank else 0.0,
    )
    sampler = partial(
        GlobalBatchSampler,
        len(dataset),
        d.batch.global_,
        layout.replica_of(info.rank),  # a pipeline's stages all read their replica's batches
        d.batch.per_rank,
        cfg.train.steps,
        cfg.train.seed,
        cfg.data.shuffle,
    )
    if layout.pipelined:
        return _pipeline_trainer(cfg, engine, info, d, run_dir, module, dataset, sampler, common)
    if cfg.model.activation_checkpointing:
        checkpoint_blocks(module, declared_checkpoint_blocks(cfg.model))
    if cfg.parallelism.name in SHARDED:
        watch.phase("comm", 0)  # sharding creates the mesh's process groups: every rank must arrive
        opt = partial(make_optimizer, cfg, lr=cfg.optim.lr)
        return sharded_trainer(cfg, engine, info, d, run_dir, module, opt, sampler, dataset, common)
    scaler = make_scaler(cfg.precision, device.type)
    watch.phase("comm", 0)  # wrapping (DDP) and the broadcast wait for every rank to get here
    model, optimizer = engine.wrap(cfg, module, make_optimizer(cfg, module, cfg.optim.lr))
    # into the unwrapped model (checkpoints are the same for every engine), after wrapping:
    # Horovod's DistributedOptimizer starts from its base optimizer's parameter groups only
    restored = checkpoint.restore(run_dir, module, optimizer, scaler, cfg.train.resume_from)
    if restored.path is None:  # with a checkpoint, every rank read the same file: no broadcast
        engine.broadcast_initial(module, optimizer)
    loader = build_loader(cfg.data, dataset, sampler(start_step=restored.step))
    t = DataParallelTrainer(
        model=model, optimizer=optimizer, scaler=scaler, loader=loader, weights=module, **common
    )
    return t, restored


def _pipeline_trainer(
    cfg: Config,
    engine: Engine,
    info: RankInfo,
    d: Derived,
    run_dir: Path,
    module: nn.Module,
    dataset: Any,  # the built-in or the user's map-style dataset
    sampler: Callable[..., GlobalBatchSampler],
    common: Common,
) -> tuple[Trainer, checkpoint.Restored]:
    """This rank's stages of the model under the schedule; the stage's replicas average their
    gradients through the engine. Checkpoints hold the whole model (gathered at save)."""
    from hpctrain.train.pipeline import (
        StageOptimizer,
        StageWeights,
        build_pipe,
        ensure_process_group,
        make_groups,
        pieces_for,
    )

    layout = layout_for(cfg, d.world_size)
    device = common["device"]
    ensure_process_group(device)
    pp_group, dp_group = make_groups(layout, info.rank)
    x0 = dataset[0][0]
    example = x0.unsqueeze(0).expand(d.batch.micro, *x0.shape).contiguous().to(device)
    pieces = pieces_for(cfg, module, layout, info.rank, example, device)
    del module  # this rank keeps its pieces only
    base = make_optimizer(cfg, nn.ModuleList(pieces), cfg.optim.lr)
    run, optimizer = pieces, base
    if layout.replicas > 1:
        if not isinstance(engine, StageReplicas):
            raise CommError(f"engine {engine.name} cannot average a pipeline stage over its replicas")
        run, optimizer = engine.wrap_stage(cfg, pieces, base, dp_group)
    stage = layout.stage_of(info.rank)
    weights = StageWeights(pieces)
    restored = checkpoint.restore(
        run_dir, weights, StageOptimizer(optimizer, stage), None, cfg.train.resume_from
    )
    pipe = build_pipe(
        cfg, run, layout, info.rank, device, pp_group, common["criterion"], delay_s=common["delay_s"]
    )
    loader = build_loader(cfg.data, dataset, sampler(start_step=restored.step))
    t = PipelineTrainer(
        pipe=pipe, optimizer=optimizer, scaler=None, loader=loader, weights=weights, stage=stage, **common
    )
    return t, restored


def train(
    cfg: Config,
    engine: Engine,
    info: RankInfo,
    d: Derived,
    run_dir: Path,
    emit: Callable[[str], None] = print,
    control: StopControl | None = None,
) -> records.RankSummary | None:
    """Run cfg.train.steps steps; return this rank's summary, or None if stopped by `control`
    (after a checkpoint). Rank 0 also logs and reports."""
    t, restored = build_trainer(cfg, engine, info, d, run_dir)
    master = info.rank == 0
    if master:
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
    out = _steps(cfg, engine, info, d, run_dir, t, restored.step, emit, control)
    t.watch.stop()
    if prof is not None:
        prof.close()
    if out is None:
        return None
    probe, wait = t.after_training(engine, out, d.world_size, info.rank, str(cfg.parallelism.compression))
    if cfg.train.save_model:
        weights = t.whole_model_state(engine)
        if master:
            buf = io.BytesIO()
            torch.save(weights, buf)
            records.write_atomic(run_dir / records.MODEL, buf.getvalue())
    return rank_stats(
        out,
        info.rank,
        info.hostname,
        peak_bytes(t.device),
        t.parameters,
        stage=t.stage,
        threads=torch.get_num_threads(),
        grad_tensors=t.grad_tensors(),
        probe=probe,
        wait_s=wait,
        held=t.held_bytes(),
        link=t.link(),
    )


def _steps(
    cfg: Config,
    engine: Engine,
    info: RankInfo,
    d: Derived,
    run_dir: Path,
    t: Trainer,
    start: int,
    emit: Callable[[str], None],
    control: StopControl | None,
) -> list[records.StepRecord] | None:
    """The steps from `start` on, each recorded as it completes; None when every rank agreed to
    stop (after a checkpoint)."""
    master, last_event = info.rank == 0, 0.0
    steps_path = run_dir / records.steps_file(info.rank)
    out = records.resume_steps(steps_path, start)
    t.watch.phase("data", start)
    with open(steps_path, "w", buffering=1) as steps_file:  # line by line: status sees progress
        steps_file.writelines(records.step_line(r) for r in out)
        t_prev = time.perf_counter()
        for step, (x, y) in enumerate(t.loader, start=start):
            _debug_hooks(cfg, info.rank, step, start, t, control, emit if master else None)
            x, y = place_batch(cfg, x, t.device), y.to(t.device, non_blocking=True)
            # the copies are queued on the compute stream before this mark, so the copy to the
            # device is part of the data wait, which ends when the device reaches it (the step
            # reads that once it has settled: StepResult.began)
            arrived = t.clock.mark()
            lr = lr_at(step, cfg.optim, d.lr)
            vote = control.requested if control is not None else None
            r = t.train_step(engine, cfg, StepInput(x, y, lr, step, vote, arrived))
            t.watch.phase("data", step + 1)  # what follows counts as the next step's data wait
            rec = _record(cfg, d, info.rank, step, lr, r, t_prev)
            t_prev = r.end
            out.append(rec)
            steps_file.write(records.step_line(rec))
            t.watch.completed(step)
            if step + 1 == cfg.train.warmup_steps:  # the peak of the timed steps, as their times:
                reset_peak(t.device)  # the first step's lazy imports and kernel choice are not the model's
            if cfg.train.stop_on_nonfinite_loss and not math.isfinite(r.loss):
                raise NonFiniteLoss(
                    f"the loss is {r.loss} at step {step} on rank {info.rank} (lr {lr:g}); lower "
                    "optim.lr or use a wider precision, or set train.stop_on_nonfinite_loss=false"
                )
            if master:
                last_event = _report(cfg, rec, emit, last_event)
            if control is not None:
                if _checkpoint_due(cfg, control, step, r.stop):
                    steps_file.flush()
                    path = t.save_checkpoint(run_dir, step + 1, engine, master)
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


def _record(
    cfg: Config, d: Derived, rank: int, step: int, lr: float, r: StepResult, t_prev: float
) -> records.StepRecord:
    return records.StepRecord(
        step=step,
        rank=rank,
        loss=r.loss,
        lr=lr,
        data_s=max(0.0, r.began - t_prev),  # 0 at worst: both host times read as the device settled
        compute_s=r.compute_s,
        comm_s=r.comm_s,
        step_s=r.end - t_prev,
        samples=d.batch.per_rank,
        samples_per_s=d.batch.global_ / (r.end - t_prev),
        timed=step >= cfg.train.warmup_steps,
        bubble_s=r.bubble_s,
        transfer_s=r.transfer_s,
        schedule_s=r.schedule_s,
        p2p_bytes=r.p2p_bytes,
        pipe_s=r.pipe_s,
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
    """debug.hold_step (first attempt only) and debug.fail_rank/fail_step, before the step."""
    if step == cfg.debug.hold_step and start == 0 and control is not None:
        t.watch.phase("hold", step)
        _hold(control, step, emit)
    if cfg.debug.fail_rank == rank and step == cfg.debug.fail_step:
        _inject_failure(cfg.debug.fail_mode, rank, step)


def _report(cfg: Config, rec: records.StepRecord, emit: Callable[[str], None], last_event: float) -> float:
    """Rank 0: a log line every log_interval steps; progress events at most 5 times a second."""
    step, steps = rec.step, cfg.train.steps
    now = time.monotonic()
    done = step + 1 == steps
    if (step + 1) % cfg.train.log_interval == 0 or done:
        emit(
            f"step {step + 1}/{steps}  loss {rec.loss:.4f}  lr {rec.lr:.4g}  "
            f"step {1e3 * rec.step_s:.1f} ms (compute {1e3 * rec.compute_s:.1f}, "
            f"comm {1e3 * rec.comm_s:.1f}, data {1e3 * rec.data_s:.1f})  {rec.samples_per_s:.0f} samples/s"
        )
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


def _inject_failure(mode: str, rank: int, step: int) -> None:
    if mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    raise InjectedFailure(f"injected failure on rank {rank} at step {step} (debug.fail_rank/fail_step)")
