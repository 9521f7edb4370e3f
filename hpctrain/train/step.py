"""One training step, and the objects it works on. The driver (loop.py) owns everything around
it: data timing, resume, cooperative stop, checkpoints and records.

Two trainers share the opening and closing of a step and differ in its middle: the data-parallel
one runs forward and backward on the whole model (here), the pipeline one runs the schedule over
this rank's stages (parallel/pipeline/step.py). A step is timed in two parts after its data has arrived:
  compute  forward + backward (+ the optimizer update); allreduces overlap the backward pass
  comm     exposed communication: time the step waits for gradient communication after its
           backward computation is done (the engine says how it measures it: engine/*.py)
Both are spans between the clock's marks (engine/clock.py): the host's clock on CPUs, CUDA events
on the compute stream on GPUs, read once the step has ended (settle: the only wait for the device).
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from hpctrain.config.schema import Config
from hpctrain.engine.clock import Clock, Mark
from hpctrain.train import checkpoint
from hpctrain.train import dims as rank_dims
from hpctrain.train.checkpoint import Weights
from hpctrain.train.comm_probe import probe_allreduce
from hpctrain.train.memory import held_bytes
from hpctrain.train.objective import Objective
from hpctrain.train.precision import autocast
from hpctrain.train.stats import straggler_waits
from hpctrain.train.watchdog import Watchdog

if TYPE_CHECKING:
    from hpctrain.engine.base import Engine
    from hpctrain.records import StepRecord
    from hpctrain.train.dims import RankDimension


@dataclass(frozen=True)
class StepInput:
    """One step's batch (on the device), learning rate and index; `stop_vote` (None: no vote) is
    this rank's wish to stop; `start` the clock's mark when the batch had arrived."""

    x: torch.Tensor
    y: torch.Tensor
    lr: float
    step: int
    stop_vote: bool | None
    start: Mark


@dataclass(frozen=True)
class StepResult:
    loss: float
    compute_s: float
    comm_s: float
    end: float  # perf_counter() when the step had ended on the device (the clock settled)
    began: float  # perf_counter() when the device had reached the step's start (its data arrived)
    stop: bool  # every rank agreed to stop after this step
    # what a dimension of the layout measured in this step, by part key (records/parts.py's step
    # parts: a pipeline's PipelineStep); empty in plain data parallelism
    parts: dict[str, Any] = field(default_factory=dict)


@dataclass(kw_only=True)
class Trainer(ABC):
    """A rank's training, holding its wiring: the run's config and engine live here, so a step is
    given only its batch."""

    cfg: Config
    engine: Engine
    optimizer: Any  # the engine's optimizer (Horovod's DistributedOptimizer, or the plain one)
    scaler: torch.amp.GradScaler | None  # fp16 only
    loader: torch.utils.data.DataLoader[Any]
    device: torch.device
    objective: Objective  # the step's loss from the model and the batch (train/objective.py)
    weights: Weights  # what checkpoints and model.pt hold: the model without the engine's wrapper
    clock: Clock  # marks where the work runs (engine/clock.py): host time, or CUDA events
    watch: Watchdog  # told the phase of each step (stall detection)
    parameters: int  # of the whole model (a pipeline rank holds only its stage's)
    delay_s: float = 0.0  # debug.slow_rank: sleep before each backward pass (a straggler, for tests)
    # the rank sides of the layout's named dimensions (train/dims.py): each step runs inside them
    dims: tuple[RankDimension, ...] = ()

    @abstractmethod
    def train_step(self, b: StepInput) -> StepResult:
        """Forward, backward, gradient averaging and update on one batch whose data arrived at
        b.start (so data + compute + comm is the whole step). The stop vote is agreed on by a
        one-element allreduce started before the gradients', so every rank stops after the same
        step."""

    def train_mode(self) -> None:
        """Before the first step (pipeline pieces are traced in training mode already)."""
        return None

    def held_bytes(self) -> dict[str, int]:
        """Parameter, gradient and optimizer-state bytes this rank holds (its shards when sharded)."""
        w = self.weights
        module = w if isinstance(w, nn.Module) else nn.ModuleList(getattr(w, "pieces", []))
        return held_bytes(module, self.optimizer)

    def figures(self) -> dict[str, dict[str, Any]]:
        """What this rank's dimensions measured once, by part key (records/parts.py's rank parts:
        a pipeline's stage and link, tensor parallelism's collectives); the means of the steps'
        parts are added to them. Asked after training, on every rank (a dimension's figures may
        need its group)."""
        return rank_dims.figures(self.dims)

    @abstractmethod
    def grad_tensors(self) -> int:
        """Gradient tensors the engine averages (what the roofline counts messages by)."""

    def after_training(
        self, out: list[StepRecord], world: int, rank: int
    ) -> tuple[tuple[float, float], float]:
        """(the run's own allreduce probe, this rank's wait for the slowest rank): collectives
        every rank calls after its last step. Not measured here: (0, 0) and NaN."""
        return (0.0, 0.0), (0.0 if world == 1 else float("nan"))

    @abstractmethod
    def whole_model_state(self) -> dict[str, Any]:
        """The whole model's state dict (collective: every rank calls it)."""

    @abstractmethod
    def save_checkpoint(self, run_dir: Path, step: int, master: bool) -> Path | None:
        """Rank 0 writes the checkpoint of the whole model (collective: every rank calls it)."""

    # --- the opening and closing every step shares ----------------------------------------------
    def _open(self, b: StepInput) -> Any:
        """Compute begins: start the stop vote, set the learning rate, clear the gradients."""
        self.watch.phase("compute", b.step)
        vote = self.engine.vote(b.stop_vote, b.step) if b.stop_vote is not None else None
        for group in self.optimizer.param_groups:
            group["lr"] = b.lr
        self.optimizer.zero_grad()
        return vote

    def _communicate(self, step: int, wait: bool) -> Mark | None:
        """Wait for the averaged gradients (`wait`): the mark where the backward computation ended
        if the backward pass went on to wait for communication."""
        self.watch.phase("comm", step)
        return self.engine.wait_gradients(self.optimizer) if wait else None

    def _agreed(self, vote: Any) -> bool:
        """Whether every rank agreed to stop after this step. Read once the step has settled: the
        vote was started before the gradients' collectives, so it has arrived by then, and reading
        it earlier would make the host wait for the device in mid-step (on CUDA the update's
        kernels would then be queued only after the backward pass had run, leaving the GPU idle)."""
        return vote is not None and self.engine.vote_result(vote)

    def _waited(self, ready: Mark | None, backward_end: Mark) -> float:
        """Seconds the backward pass spent waiting for communication after its computation ended
        (at `ready`); read after the step settled."""
        return max(0.0, self.clock.seconds(ready, backward_end)) if ready is not None else 0.0

    def _settle(self, start: Mark, end: Mark) -> tuple[float, float]:
        """Wait for the device to reach `end`, the step's last mark: the host's time then, and the
        host's time when the device had reached `start` (the data's arrival, where the step's parts
        begin). The one wait per step: the data's arrival is read here, not waited for on its own,
        so the host queues the forward pass while the batch is still being copied."""
        t_end = self.clock.settle(end)
        return t_end, t_end - self.clock.seconds(start, end)

    def _update(self, step: int, averaged: bool) -> Mark:
        """The optimizer step (through the engine when it averaged the gradients); its end."""
        self.watch.phase("optimizer", step)
        if averaged:
            self.engine.optimizer_step(self.optimizer, self.scaler)
        else:
            from hpctrain.engine.base import step_optimizer

            step_optimizer(self.optimizer, self.scaler)
        return self.clock.mark()


@dataclass(kw_only=True)
class DataParallelTrainer(Trainer):
    """Every rank holds the whole model; the engine averages the gradients."""

    model: nn.Module  # what to call: the engine's wrapper (DDP) or the model itself (Horovod)

    def train_step(self, b: StepInput) -> StepResult:
        engine, cfg = self.engine, self.cfg
        vote = self._open(b)
        acc = cfg.parallelism.backward_passes_per_step
        losses: list[torch.Tensor] = []
        # The engine averages each gradient after the `acc`-th backward pass, so the micro-batch
        # losses are divided by acc: the sum of their gradients is the per-rank batch mean. With
        # one micro-batch nothing is divided or summed: each is a kernel the host must queue, and a
        # small model on a GPU waits for the host (hpctrain bench overhead --device cuda).
        # one micro-batch: the batch itself (chunk would make two views a step, ~5 us each)
        pieces = zip(b.x.chunk(acc), b.y.chunk(acc)) if acc > 1 else ((b.x, b.y),)
        for i, (xs, ys) in enumerate(pieces):
            with engine.micro_batch(self.model, last=i == acc - 1):
                with autocast(cfg.precision.name, self.device.type), rank_dims.within(self.dims):
                    loss = self.objective(self.model, xs, rank_dims.targets(self.dims, ys))
                    loss = loss / acc if acc > 1 else loss
                if self.delay_s:
                    time.sleep(self.delay_s)
                with rank_dims.within(self.dims):
                    (self.scaler.scale(loss) if self.scaler else loss).backward()
            losses.append(loss.detach())
        loss_sum = losses[0] if acc == 1 else torch.stack(losses).sum()
        clock = self.clock
        backward = clock.mark()
        ready = self._communicate(b.step, True)  # DDP, FSDP: waited in backward
        comm = clock.mark()
        end = self._update(b.step, averaged=True)
        t_end, began = self._settle(b.start, end)
        waited = self._waited(ready, backward)
        compute = clock.seconds(b.start, backward) - waited + clock.seconds(comm, end)
        comm_s = waited + clock.seconds(backward, comm)
        parts = rank_dims.step_parts(self.dims)
        loss_sum = rank_dims.loss(self.dims, loss_sum)
        return StepResult(float(loss_sum), compute, comm_s, t_end, began, self._agreed(vote), parts)

    def train_mode(self) -> None:
        self.model.train()

    def grad_tensors(self) -> int:
        return sum(1 for p in self.model.parameters() if p.requires_grad)

    def after_training(
        self, out: list[StepRecord], world: int, rank: int
    ) -> tuple[tuple[float, float], float]:
        if world == 1:
            return (0.0, 0.0), 0.0
        engine = self.engine
        probe = probe_allreduce(engine, self.parameters, self.device, str(self.cfg.parallelism.compression))
        busy = {r.step: r.data_s + r.compute_s for r in out if r.timed}  # one type on every rank
        return probe, straggler_waits(engine.allgather_object(busy))[rank]

    def whole_model_state(self) -> dict[str, Any]:
        return self.weights.state_dict()

    def save_checkpoint(self, run_dir: Path, step: int, master: bool) -> Path | None:
        return checkpoint.save(run_dir, step, self.weights, self.optimizer, self.scaler) if master else None
