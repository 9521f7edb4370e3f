"""One training step, and the objects it works on. The driver (loop.py) owns everything around
it: data timing, resume, cooperative stop, checkpoints and records.

A step is timed in three parts after its data has arrived (wall clock; the device is
synchronised on GPUs):
  compute  forward + backward (+ the optimizer update); allreduces overlap the backward pass
  comm     exposed communication: time the step waits for gradient communication after its
           backward computation is done (the engine says how it measures it: engine/*.py)
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ..config.schema import Config
from .precision import autocast
from .watchdog import Watchdog

if TYPE_CHECKING:
    from ..engine.base import Engine


@dataclass
class Trainer:
    model: nn.Module
    optimizer: Any  # the engine's optimizer (Horovod's DistributedOptimizer, or the plain one)
    scaler: torch.amp.GradScaler | None
    loader: torch.utils.data.DataLoader
    device: torch.device
    criterion: nn.Module
    delay_s: float = 0.0  # debug.slow_rank: sleep before each backward pass (a straggler, for tests)
    watch: Watchdog | None = None  # told the phase of each step (stall detection)
    module: Any = None  # the model without the engine's wrapper (weights, checkpoints)
    pipe: Any = None  # train.pipeline.Pipe: this rank's stages and schedule (pipelines)
    parameters: int = 0  # of the whole model (a pipeline rank holds only its stage's)

    @property
    def weights(self) -> Any:
        return self.module if self.module is not None else self.model


@dataclass(frozen=True)
class StepResult:
    loss: float
    compute_s: float
    comm_s: float
    end: float  # perf_counter() when the step ended
    stop: bool  # every rank agreed to stop after this step
    bubble_s: float = 0.0  # pipelines: waiting for the neighbouring stages


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train_step(
    t: Trainer,
    engine: Engine,
    cfg: Config,
    x: torch.Tensor,
    y: torch.Tensor,
    lr: float,
    step: int,
    stop_vote: bool | None,
    t_start: float,
) -> StepResult:
    """Forward, backward, gradient averaging and update on one batch whose data arrived at
    `t_start` (so data + compute + comm is the whole step). `stop_vote` (None: no vote) is this
    rank's wish to stop, agreed on by a one-element allreduce started before the gradients', so
    every rank stops after the same step."""
    opt, dev, watch = t.optimizer, t.device, t.watch
    if watch is not None:
        watch.phase("compute", step)
    acc = cfg.parallelism.backward_passes_per_step
    vote = engine.vote(stop_vote, step) if stop_vote is not None else None
    for group in opt.param_groups:
        group["lr"] = lr
    opt.zero_grad()
    loss_sum = torch.zeros((), device=dev)
    # The engine averages each gradient after the `acc`-th backward pass, so the micro-batch
    # losses are divided by acc: the sum of their gradients is the per-rank batch mean.
    for i, (xs, ys) in enumerate(zip(x.chunk(acc), y.chunk(acc))):
        with engine.micro_batch(t.model, last=i == acc - 1):
            with autocast(cfg.precision.name, dev.type):
                logits = t.model(xs)
                loss = t.criterion(logits, ys) / acc
            if t.delay_s:
                time.sleep(t.delay_s)
            (t.scaler.scale(loss) if t.scaler else loss).backward()
        loss_sum += loss.detach()
    sync(dev)
    t_backward = time.perf_counter()

    if watch is not None:
        watch.phase("comm", step)
    waited = engine.wait_gradients(opt, t_backward)  # DDP: waited inside backward already
    stop = vote is not None and engine.vote_result(vote)
    sync(dev)
    t_comm = time.perf_counter()

    if watch is not None:
        watch.phase("optimizer", step)
    engine.optimizer_step(opt, t.scaler)
    sync(dev)
    t_end = time.perf_counter()
    compute = (t_backward - t_start - waited) + (t_end - t_comm)
    return StepResult(float(loss_sum), compute, waited + (t_comm - t_backward), t_end, stop)
