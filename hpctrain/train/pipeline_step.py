"""One pipeline training step: the schedule runs every micro-batch through this rank's stages,
the stage's replicas average their gradients (hybrid), the optimizer steps. Timed as the data-
parallel step (train/step.py) plus the bubble:

  compute  this rank's forward and backward chunks, and the optimizer update
  bubble   the rest of the schedule: waiting for neighbours and the transfers it cannot hide
  comm     exposed gradient communication among the replicas (hybrid), as the engine measures it
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from ..config.schema import Config
from ..engine.base import step_optimizer
from .pipeline import Pipe
from .precision import autocast
from .step import StepResult, Trainer, sync

if TYPE_CHECKING:
    from ..engine.base import Engine


def pipeline_step(
    t: Trainer,
    pipe: Pipe,
    engine: Engine,
    cfg: Config,
    x: torch.Tensor,
    y: torch.Tensor,
    lr: float,
    step: int,
    stop_vote: bool | None,
    t_start: float,
) -> StepResult:
    opt, dev, watch = t.optimizer, t.device, t.watch
    if watch is not None:
        watch.phase("compute", step)
    vote = engine.vote(stop_vote, step) if stop_vote is not None else None
    for group in opt.param_groups:
        group["lr"] = lr
    opt.zero_grad()
    pipe.clock.compute_s, pipe.clock.backward_end = 0.0, t_start
    losses: list[torch.Tensor] = []
    with autocast(cfg.precision.name, dev.type):
        if pipe.first:
            pipe.schedule.step(x, target=y if pipe.last else None, losses=losses)
        elif pipe.last:
            pipe.schedule.step(target=y, losses=losses)
        else:
            pipe.schedule.step()
    sync(dev)
    t_sched = time.perf_counter()
    # every rank of the pipeline logs the loss its last stage computed (micro-batch losses were
    # divided by their number: their sum is the batch mean)
    loss = torch.stack([v.detach().float() for v in losses]).sum() if losses else torch.zeros(())
    sent = dist.broadcast(loss, src=pipe.last_rank, group=pipe.group, async_op=True)

    if watch is not None:
        watch.phase("comm", step)
    replicated = pipe.layout.replicas > 1
    waited = engine.wait_gradients(opt, pipe.clock.backward_end) if replicated else 0.0
    stop = vote is not None and engine.vote_result(vote)
    sent.wait()
    sync(dev)
    t_comm = time.perf_counter()

    if watch is not None:
        watch.phase("optimizer", step)
    if replicated:
        engine.optimizer_step(opt, None)
    else:
        step_optimizer(opt, None)
    sync(dev)
    t_end = time.perf_counter()
    stage_compute = pipe.clock.compute_s - waited  # DDP waits inside the last backward chunk
    return StepResult(
        float(loss),
        stage_compute + (t_end - t_comm),
        waited + (t_comm - t_sched),
        t_end,
        stop,
        bubble_s=max(0.0, (t_sched - t_start) - pipe.clock.compute_s),
    )
