"""What every rank builds before its parallelism takes the model: the device, the model (with the
same initial weights everywhere), the loss, the dataset and the sampler, under the watchdog. The
parallelism's `build` (parallel/*.py) then wraps, shards or cuts the model into its trainer; the
data-parallel trainer is here, the pipeline's in parallel/pipeline/setup.py, the one over a device mesh in mesh_trainer.py."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict, cast

import torch
from torch import nn

from hpctrain.config.derived import Derived
from hpctrain.config.schema import Config
from hpctrain.config.split import declared_checkpoint_blocks
from hpctrain.engine.clock import Clock, clock_for
from hpctrain.engine.device import current_device
from hpctrain.engine.world import RankInfo
from hpctrain.train import checkpoint, optim
from hpctrain.train.compile import compile_blocks
from hpctrain.train.data import GlobalBatchSampler, build_loader
from hpctrain.train.materialize import Deferred, defer, materialize, replayable
from hpctrain.train.modules import checkpoint_blocks
from hpctrain.train.objective import Objective
from hpctrain.train.parts import make_dataset, make_model, make_objective, workload_label
from hpctrain.train.precision import make_scaler
from hpctrain.train.step import DataParallelTrainer, Trainer
from hpctrain.train.targets import probe
from hpctrain.train.watchdog import Watchdog

if TYPE_CHECKING:
    from hpctrain.engine.base import Engine
    from hpctrain.train.dims import LayerSplit, RankDimension


class Common(TypedDict):
    """What every trainer is built with."""

    cfg: Config
    engine: Engine
    device: torch.device
    clock: Clock
    objective: Objective
    watch: Watchdog
    parameters: int
    delay_s: float
    dims: tuple[RankDimension, ...]  # the rank sides of the layout's named dimensions (train/dims.py)


@dataclass
class Setup:
    """One rank's wiring, handed to its parallelism's `build`: the run's config, engine, world,
    derived quantities (with the plan's layout) and directory, and what was built from them."""

    cfg: Config
    engine: Engine
    info: RankInfo
    d: Derived
    run_dir: Path
    module: nn.Module  # the whole model, on the device, initialised alike on every rank
    dataset: Any  # the built-in or the user's map-style dataset
    sampler: Callable[..., GlobalBatchSampler]  # this rank's batches (start_step=...)
    common: Common
    deferred: Deferred | None = None  # `module` is on the meta device until materialize()
    notes: list[str] = field(default_factory=list)  # what rank 0 tells the user before training
    # the layout's dimension that splits each layer (tensor parallelism's), where it has one
    layer_split: LayerSplit | None = None

    def materialize(self, model: nn.Module) -> nn.Module:
        """`model` (the module, split or sharded) on this rank's device with the one-rank initial
        weights, when it was built on the meta device; as it is otherwise."""
        if self.deferred is not None:
            materialize(model, self.deferred, self.common["device"])
            self.deferred = None
        return model


Build = Callable[[Setup], "tuple[Trainer, checkpoint.Restored]"]


def place_model(cfg: Config, model: nn.Module, device: torch.device) -> nn.Module:
    """On the device, in the memory format the config asks for (NHWC for model.channels_last)."""
    model = model.to(device)
    if cfg.model.channels_last and cfg.data.name != "tokens":
        # Module.to takes memory_format (torch docs); its type stubs leave the keyword out
        model = cast(Any, model).to(memory_format=torch.channels_last)
    return model


def make_optimizer(cfg: Config, model: nn.Module, lr: float) -> torch.optim.Optimizer:
    return optim.build(cfg.optim, model.parameters(), lr)


def prepare(cfg: Config, engine: Engine, info: RankInfo, d: Derived, run_dir: Path) -> Setup:
    """Model, loss and data on this rank, before its parallelism takes them."""
    device = current_device(cfg.train.device)  # bound by the rank entry, before the engine started
    # watched from the start: a model or dataset constructor (the user's _target_) may hang too
    watch = Watchdog(run_dir, info.rank, d.world_size, cfg.train.stall_timeout_s)
    watch.phase("build", 0)
    watch.start()
    torch.manual_seed(cfg.train.seed)  # identical initial weights everywhere; broadcast makes sure
    module, deferred = build_model(cfg, d, device)
    objective = make_objective(cfg)
    dataset = make_dataset(cfg, d.batch.global_)
    if cfg.user_code:
        probe(module, objective, dataset, device, workload_label(cfg))
    common = Common(
        cfg=cfg,
        engine=engine,
        device=device,
        clock=clock_for(device),
        objective=objective,
        watch=watch,
        parameters=sum(p.numel() for p in module.parameters()),
        delay_s=cfg.debug.slow_s
        if info.rank == cfg.debug.slow_rank or info.hostname == cfg.debug.slow_node
        else 0.0,
        dims=(),  # given by the layout's dimensions before the parallelism builds (parallel/dimensions.py)
    )
    sampler = partial(
        GlobalBatchSampler,
        len(dataset),
        d.batch.global_,
        d.layout.replica_of(info.rank),  # a pipeline's stages all read their replica's batches
        d.batch.per_rank,
        cfg.train.steps,
        cfg.train.seed,
        cfg.data.shuffle,
    )
    notes = [n for n in (batchnorm_note(module, d),) if n]
    return Setup(cfg, engine, info, d, run_dir, module, dataset, sampler, common, deferred, notes)


def batchnorm_note(module: nn.Module, d: Derived) -> str:
    """BatchNorm normalises by the statistics of the batch it sees: where that is a rank's slice
    or a micro-batch, not the global batch, N ranks cannot train exactly what one rank trains
    (nor can accumulation), whatever the engine; said once, not silent. ('' otherwise.)"""
    norms = sum(1 for m in module.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm))
    b = d.batch
    if not norms or b.micro >= b.global_:
        return ""
    return (
        f"note: the model's {norms} BatchNorm layer(s) normalise each micro-batch of {b.micro} samples, "
        f"not the global batch of {b.global_}: their statistics, and so the weights, differ from one "
        "rank's (as under DDP and Horovod by default); tensor parallelism, or one micro-batch on one "
        "replica, keeps the whole batch together"
    )


def build_model(cfg: Config, d: Derived, device: torch.device) -> tuple[nn.Module, Deferred | None]:
    """The model whole on the device, or, where the layout splits or shards it and the model's
    weights can be drawn again (materialize.py), on the meta device until it is."""
    splits = d.layout.shard > 1 or d.layout.tp > 1
    if splits and not cfg.user_code and not cfg.model.channels_last and not cfg.parallelism.shard.cpu_offload:
        state = torch.get_rng_state()
        with torch.device("meta"):
            module = make_model(cfg)
        if replayable(module):
            return module, defer(module, state)
        torch.set_rng_state(state)
    return place_model(cfg, make_model(cfg), device), None


def recompute_blocks(s: Setup) -> None:
    """model.activation_checkpointing: the declared blocks recompute in the backward pass."""
    if s.cfg.model.activation_checkpointing:
        checkpoint_blocks(s.module, declared_checkpoint_blocks(s.cfg.model))


def data_parallel_trainer(
    s: Setup, trainer: type[DataParallelTrainer] = DataParallelTrainer
) -> tuple[Trainer, checkpoint.Restored]:
    """The whole model on every rank, wrapped by the engine to average its gradients; `trainer`:
    the step (a parallelism from another package may add its own figures to it)."""
    cfg, engine = s.cfg, s.engine
    s.materialize(s.module)
    recompute_blocks(s)
    compile_blocks(cfg, s.module, s.run_dir, s.notes)
    scaler = make_scaler(cfg.precision, s.common["device"].type)
    s.common["watch"].phase("comm", 0)  # wrapping (DDP) and the broadcast wait for every rank
    model, optimizer = engine.wrap(s.module, make_optimizer(cfg, s.module, cfg.optim.lr))
    # into the unwrapped model (checkpoints are the same for every engine), after wrapping:
    # Horovod's DistributedOptimizer starts from its base optimizer's parameter groups only
    restored = checkpoint.restore(s.run_dir, s.module, optimizer, scaler, cfg.train.resume_from)
    if restored.path is None:  # with a checkpoint, every rank read the same file: no broadcast
        engine.broadcast_initial(s.module)
    loader = build_loader(cfg.data, s.dataset, s.sampler(start_step=restored.step))
    t = trainer(model=model, optimizer=optimizer, scaler=scaler, loader=loader, weights=s.module, **s.common)
    return t, restored
