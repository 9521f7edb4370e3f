"""The training loop every rank runs, readable top to bottom.

Each step is timed in four parts (seconds, wall clock, device synchronised on GPUs):
  data     waiting for the next batch and copying it to the device
  compute  forward + backward (+ the optimizer update); allreduces overlap the backward pass
  comm     exposed communication: time blocked in optimizer.synchronize() waiting for the
           allreduces still in flight after the backward pass ended
  step     the whole step, from the end of the previous step
"""
from __future__ import annotations

import io
import json
import os
import resource
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from .. import records
from . import checkpoint
from ..config.schema import Config
from ..config.validate import Batch
from ..events import format_event
from .comm import RankInfo
from .data import GlobalBatchSampler, build_dataset, build_loader
from .models import InputSpec, build_model
from .precision import autocast, make_scaler
from .schedule import lr_at
from .stats import rank_stats


class InjectedFailure(RuntimeError):
    """Raised by the debug.fail_rank / debug.fail_step fault injection."""


@dataclass
class StopControl:
    """Cooperative stop for preemption and time limits (SLURM).

    A signal handler sets `requested`; at every step the ranks agree on it with a one-element
    allreduce that Horovod fuses with the gradients, so all stop after the same step. Rank 0 then
    writes a checkpoint, and the caller requeues the job.
    """

    requested: bool = False
    checkpoint_interval: int = 0  # also checkpoint every N steps (0: only when stopping)


@dataclass
class Trainer:
    model: nn.Module
    optimizer: Any  # horovod.torch DistributedOptimizer
    scaler: torch.amp.GradScaler | None
    loader: torch.utils.data.DataLoader
    device: torch.device


def pick_device(choice: str, local_rank: int) -> torch.device:
    if choice == "cuda" or (choice == "auto" and torch.cuda.is_available()):
        torch.cuda.set_device(local_rank % torch.cuda.device_count())  # one GPU per local rank
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def make_optimizer(cfg: Config, model: nn.Module, lr: float) -> torch.optim.Optimizer:
    o = cfg.optim
    if o.name == "adamw":
        return torch.optim.AdamW(model.parameters(), lr=lr, betas=(o.betas[0], o.betas[1]),
                                 weight_decay=o.weight_decay)
    return torch.optim.SGD(model.parameters(), lr=lr, momentum=o.momentum, weight_decay=o.weight_decay)


def build_trainer(cfg: Config, hvd: Any, info: RankInfo, batch: Batch, run_dir: Path) -> tuple[Trainer, int]:
    """Model, optimizer and data, restored from the latest checkpoint if there is one."""
    device = pick_device(cfg.train.device, info.local_rank)
    torch.manual_seed(cfg.train.seed)  # identical initial weights everywhere; broadcast makes sure
    model = build_model(cfg.model, InputSpec.from_data(cfg.data)).to(device)
    if cfg.model.channels_last and cfg.data.name != "tokens":
        model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    base = make_optimizer(cfg, model, cfg.optim.lr)
    compression = hvd.Compression.fp16 if cfg.parallelism.compression == "fp16" else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(
        base, named_parameters=model.named_parameters(), compression=compression,
        backward_passes_per_step=cfg.parallelism.backward_passes_per_step, op=hvd.Average)
    scaler = make_scaler(cfg.precision, device.type)
    start = 0
    ckpt = checkpoint.latest(run_dir)
    if ckpt is not None:  # every rank reads the same file: no broadcast needed after it
        start = checkpoint.load(ckpt, model, optimizer, scaler)
    else:
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    dataset = build_dataset(cfg.data, cfg.train.seed)
    sampler = GlobalBatchSampler(len(dataset), batch.global_, info.rank, batch.per_rank,  # type: ignore[arg-type]
                                 cfg.train.steps, cfg.train.seed, cfg.data.shuffle, start_step=start)
    loader = build_loader(cfg.data, dataset, sampler)
    return Trainer(model, optimizer, scaler, loader, device), start


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def _previous_records(path: Path, start: int) -> list[dict[str, Any]]:
    """Records of the steps before `start` from an earlier attempt; later ones are dropped, so a
    resumed run never counts a step twice."""
    if start == 0 or not path.exists():
        return []
    return [r for r in records.iter_jsonl(path) if r["step"] < start]


def train(cfg: Config, hvd: Any, info: RankInfo, batch: Batch, target_lr: float, run_dir: Path,
          emit: Callable[[str], None] = print, control: StopControl | None = None) -> dict[str, Any] | None:
    """Run cfg.train.steps steps; return this rank's statistics, or None if stopped by `control`
    (after a checkpoint). Rank 0 also logs and reports."""
    t, start = build_trainer(cfg, hvd, info, batch, run_dir)
    model, opt, scaler, dev = t.model, t.optimizer, t.scaler, t.device
    acc = cfg.parallelism.backward_passes_per_step
    criterion = nn.CrossEntropyLoss()
    master = info.rank == 0
    fail_here = cfg.debug.fail_rank == info.rank
    steps_path = run_dir / records.steps_file(info.rank)
    out = _previous_records(steps_path, start)
    if start and master:
        emit(f"resuming from {checkpoint.latest(run_dir)} at step {start}")
    last_event = 0.0
    model.train()
    with open(steps_path, "w") as steps_file:
        for rec in out:
            steps_file.write(json.dumps(rec) + "\n")
        t_prev = time.perf_counter()
        for step, (x, y) in enumerate(t.loader, start=start):
            if control is not None:  # launched now, completed with the gradients' allreduce
                stop_handle = hvd.allreduce_async(torch.tensor([float(control.requested)]), op=hvd.Max,
                                                  name=f"hpctrain.stop.{step}")
            if fail_here and step == cfg.debug.fail_step:
                _inject_failure(cfg.debug.fail_mode, info.rank, step)
            x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
            if cfg.model.channels_last and x.dim() == 4:
                x = x.contiguous(memory_format=torch.channels_last)
            _sync(dev)
            t_data = time.perf_counter()

            lr = lr_at(step, cfg.optim, target_lr)
            for group in opt.param_groups:
                group["lr"] = lr
            opt.zero_grad()
            loss_sum = torch.zeros((), device=dev)
            # Horovod allreduces each gradient after its `acc`-th backward pass, so the micro-batch
            # losses are divided by acc: the sum of their gradients is the per-rank batch mean.
            for xs, ys in zip(x.chunk(acc), y.chunk(acc)):
                with autocast(cfg.precision.name, dev.type):
                    logits = model(xs)
                    loss = criterion(logits.reshape(-1, logits.shape[-1]).float(), ys.reshape(-1)) / acc
                (scaler.scale(loss) if scaler else loss).backward()
                loss_sum += loss.detach()
            _sync(dev)
            t_backward = time.perf_counter()

            opt.synchronize()  # blocks until every gradient allreduce has finished
            stop = control is not None and float(hvd.synchronize(stop_handle)[0]) > 0
            _sync(dev)
            t_comm = time.perf_counter()

            with opt.skip_synchronize():
                if scaler is not None:
                    scaler.unscale_(opt)
                    scaler.step(opt)
                    scaler.update()
                else:
                    opt.step()
            _sync(dev)
            t_end = time.perf_counter()

            rec = {"step": step, "rank": info.rank, "loss": float(loss_sum), "lr": lr,
                   "data_s": t_data - t_prev, "compute_s": (t_backward - t_data) + (t_end - t_comm),
                   "comm_s": t_comm - t_backward, "step_s": t_end - t_prev,
                   "samples": batch.per_rank, "samples_per_s": batch.global_ / (t_end - t_prev),
                   "timed": step >= cfg.train.warmup_steps}
            t_prev = t_end
            out.append(rec)
            steps_file.write(json.dumps(rec) + "\n")
            if master:
                last_event = _report(cfg, rec, batch, emit, last_event)
            if control is not None:
                every = control.checkpoint_interval
                if stop or (every and (step + 1) % every == 0 and step + 1 < cfg.train.steps):
                    steps_file.flush()
                    if master:
                        path = checkpoint.save(run_dir, step + 1, model, opt, scaler)
                        emit(f"checkpoint {path.name} written after step {step + 1}")
                    hvd.allreduce(torch.zeros(1), name=f"hpctrain.ckpt.{step}")  # all wait for it
                if stop:
                    return None
    stats = rank_stats(out, peak_memory_bytes(dev))
    stats["parameters"] = sum(p.numel() for p in model.parameters())
    if master and cfg.train.save_model:
        buf = io.BytesIO()
        torch.save(model.state_dict(), buf)
        records.write_atomic(run_dir / records.MODEL, buf.getvalue())
    return stats


def _report(cfg: Config, rec: dict[str, Any], batch: Batch, emit: Callable[[str], None],
            last_event: float) -> float:
    """Rank 0: a log line every log_interval steps; progress events at most 5 times a second."""
    step, steps = rec["step"], cfg.train.steps
    now = time.monotonic()
    done = step + 1 == steps
    if (step + 1) % cfg.train.log_interval == 0 or done:
        emit(f"step {step + 1}/{steps}  loss {rec['loss']:.4f}  lr {rec['lr']:.4g}  "
             f"step {1e3 * rec['step_s']:.1f} ms (compute {1e3 * rec['compute_s']:.1f}, "
             f"comm {1e3 * rec['comm_s']:.1f}, data {1e3 * rec['data_s']:.1f})  "
             f"{batch.global_ / rec['step_s']:.0f} samples/s")
    if done or now - last_event >= 0.2:
        emit(format_event("progress", step=step + 1, steps=steps, loss=rec["loss"],
                          samples_per_s=batch.global_ / rec["step_s"]))
        return now
    return last_event


def _inject_failure(mode: str, rank: int, step: int) -> None:
    if mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    raise InjectedFailure(f"injected failure on rank {rank} at step {step} (debug.fail_rank/fail_step)")
