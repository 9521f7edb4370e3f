"""One pipeline training step: the schedule runs every micro-batch through this rank's stages,
the stage's replicas average their gradients (hybrid), the optimizer steps. It opens and closes
as the data-parallel step (train/step.py) and is timed the same way, plus the bubble:

  compute   this rank's forward and backward chunks, and the optimizer update
  bubble    idle: waiting for a neighbour that has not sent yet (p2p.py), and for the last
            stage to finish (the drain, while the loss is broadcast)
  transfer  waiting for activations and gradients to move (the link's α–β for their bytes)
  schedule  the rest of the schedule's wall time: its own per-micro-batch overhead
  comm      exposed gradient communication among the replicas (hybrid), as the engine measures it

Checkpoints and model.pt hold the whole model, gathered from replica 0 of every stage.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from hpctrain.engine.ties import PipelineTies
from hpctrain.parallel.pipeline.figures import PipelineRank, PipelineStep
from hpctrain.parallel.pipeline.pipe import Pipe, StageOptimizer, merge_states
from hpctrain.train import checkpoint
from hpctrain.train import dims as rank_dims
from hpctrain.train.precision import autocast
from hpctrain.train.step import StepInput, StepResult, Trainer


@dataclass(kw_only=True)
class PipelineTrainer(Trainer):
    """This rank's stages under the schedule; a stage's replicas average through the engine."""

    pipe: Pipe
    ties: PipelineTies = field(default_factory=PipelineTies)  # tied parameters spanning pieces

    def train_step(self, b: StepInput) -> StepResult:
        pipe, clock, cfg = self.pipe, self.clock, self.cfg
        vote = self._open(b)
        pipe.tally.reset()
        pipe.meter.reset()
        losses: list[torch.Tensor] = []
        # the first stage takes the batch, the last the targets (its loss's; with loss=model the
        # model's forward takes them too, as a keyword to the piece that computes the loss)
        args = (b.x,) if pipe.first else ()
        y = rank_dims.targets(self.dims, b.y)  # this rank's share of them (context parallelism's)
        kwargs = {pipe.targets_kw: y} if pipe.targets_kw else {}
        target = y if pipe.last else None
        with autocast(cfg.precision.name, self.device.type), rank_dims.within(self.dims):
            pipe.schedule.step(*args, target=target, losses=losses, return_outputs=False, **kwargs)
        sched = clock.mark()
        # every rank of the pipeline logs the loss its last stage computed (micro-batch losses
        # were divided by their number: their sum is the batch mean)
        loss = torch.stack([v.detach().float() for v in losses]).sum() if losses else torch.zeros(())
        loss = loss.to(self.device)  # NCCL broadcasts device tensors
        sent = dist.broadcast(loss, src=pipe.last_rank, group=pipe.group, async_op=True)
        replicated = pipe.layout.replicas > 1
        ready = self._communicate(b.step, replicated)
        self.ties.sum_grads()  # after the replicas averaged: the copies of a tie take one update
        averaged = clock.mark()
        # the loss arrives when the last stage's schedule ends; the stages that ended first wait
        # for it: the pipeline's drain, idle time like the waits inside the schedule
        sent.wait()
        comm = clock.mark()
        end = self._update(b.step, averaged=replicated)
        t_end, began = self._settle(b.start, end)
        traffic = pipe.meter.settle(clock)
        compute = pipe.tally.compute_s()
        waited = self._waited(ready, pipe.tally.backward_end or b.start)  # DDP waits in the last chunk
        drain, schedule = clock.seconds(averaged, comm), clock.seconds(b.start, sched)
        loss = rank_dims.loss(self.dims, loss)
        return StepResult(
            float(loss),
            compute - waited + clock.seconds(comm, end),
            waited + clock.seconds(sched, averaged),
            t_end,
            began,
            self._agreed(vote),
            parts={
                PipelineStep.KEY: PipelineStep(
                    bubble_s=traffic.idle_s + drain,
                    transfer_s=traffic.transfer_s,
                    schedule_s=max(0.0, schedule - compute - traffic.wait_s),
                    p2p_bytes=traffic.bytes,
                    pipe_s=schedule + drain,
                ),
                **rank_dims.step_parts(self.dims),
            },
        )

    def figures(self) -> dict[str, dict[str, Any]]:
        link = self.pipe.meter.link
        return {
            **super().figures(),
            PipelineRank.KEY: {
                "stage": self.pipe.stage,
                "p2p_alpha_s": link.alpha_s,
                "p2p_beta_s_per_byte": link.beta_s_per_byte,
            },
        }

    def grad_tensors(self) -> int:
        return 0  # a stage's replicas average its pieces; the roofline models data parallelism only

    def _gathered(self, optimizer: bool) -> dict[str, Any]:
        """The whole model (and every stage's optimizer) from replica 0 of each stage.
        Collective: every rank calls it."""
        mine: dict[str, Any] = {}  # one type on every rank: Horovod names the allgather by it
        if self.pipe.replica == 0:
            opt = (
                StageOptimizer(self.optimizer, self.pipe.stage).state_dict() if optimizer else {"stages": {}}
            )
            mine = {"model": self.weights.state_dict(), "optimizer": opt}
        return merge_states([s for s in self.engine.allgather_object(mine) if s])

    def whole_model_state(self) -> dict[str, Any]:
        state: dict[str, Any] = self._gathered(optimizer=False)["model"]
        return state

    def save_checkpoint(self, run_dir: Path, step: int, master: bool) -> Path | None:
        state = self._gathered(optimizer=True)
        if not master:
            return None
        return checkpoint.write(
            run_dir, step, {"step": step, **state, "scaler": None, "torch_rng": torch.get_rng_state()}
        )
