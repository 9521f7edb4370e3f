"""The engine interface: what plan time asks an engine (class methods: no rank, no world), and
what the training step and loop ask it on the ranks (instance methods).

Only hybrid parallelism (pipeline stages with data-parallel replicas) needs an engine to average
a stage's gradients over its replicas, and only fsdp/hsdp to shard a model; those are optional
capabilities, StageReplicas and Sharding, not methods every engine must have (as Lightning
Fabric's strategies add capabilities as mixins). A parallelism names the one it needs
(parallel/base.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

from hpctrain.analysis.tune import Knob
from hpctrain.config.schema import Config, ParallelismConf, ShardSettings
from hpctrain.engine.world import RankInfo
from hpctrain.errors import Problem

if TYPE_CHECKING:
    import torch
    from torch import nn

    from hpctrain.engine.clock import Mark
    from hpctrain.records import Layout


S = TypeVar("S")  # an engine's own settings (its group of the schema), or None without any


@dataclasses.dataclass(frozen=True)
class EngineRun:
    """What an engine is told of the run when it is built on a rank, besides its own settings:
    the few keys its wrappers read, so no rank-side method takes the whole config."""

    device: str  # train.device: auto | cpu | cuda
    backend: str  # parallelism.backend: Horovod's transport
    compression: str  # parallelism.compression: none | fp16
    precision: str  # precision.name: fsdp's low-precision parameters
    accumulate: int  # parallelism.backward_passes_per_step
    microbatches: int  # parallelism.microbatches: a pipeline stage's backward passes per step
    shard: ShardSettings  # parallelism.shard
    rendezvous_s: float = 0.0  # train.stall_timeout_s: how long the ranks may take to meet (0: torch's)

    @classmethod
    def of(cls, cfg: Config) -> EngineRun:
        """The run's wiring, read from its config."""
        par = cfg.parallelism
        return cls(
            device=str(cfg.train.device),
            backend=str(par.backend),
            compression=str(par.compression),
            precision=str(cfg.precision.name),
            accumulate=par.backward_passes_per_step,
            microbatches=par.microbatches,
            shard=par.shard,
            rendezvous_s=cfg.train.stall_timeout_s,
        )


class Engine(ABC, Generic[S]):
    """Built once per rank with the run's wiring and the engine's own settings (registry.
    engine_for); plan time asks the class, which needs neither."""

    #: set by the registry
    name: ClassVar[str]
    #: the schema's group of this engine's own parallelism.* keys (config/schema.py), or None:
    #: given to another engine, they are refused
    settings: ClassVar[type[Any] | None] = None
    #: the allreduce benchmark's column that times the collective this engine averages with
    #: (records.AllreduceRow): what the alpha-beta fit and the roofline use
    collective: ClassVar[str] = "hvd_s"
    #: how gradients are grouped into collectives: "fusion" (a buffer filled per cycle) or
    #: "buckets" (fixed-size groups, one collective each); the roofline counts messages by it
    grouping: ClassVar[str] = "fusion"
    #: averages in hooks on the gradients' accumulation (DDP), which a backward split into input
    #: and weight gradients (zero-bubble pipeline schedules) never calls
    reduces_in_hooks: ClassVar[bool] = False
    #: its ranks meet over torch.distributed's default process group, which a layout with nothing
    #: to average starts anyway (registry.engine_on_ranks)
    torch_group: ClassVar[bool] = False

    # --- plan time ---------------------------------------------------------------------------
    @classmethod
    def problems(cls, cfg: Config) -> list[Problem]:
        """This engine's rules for the config (each names the key, the rule and the fix)."""
        return []

    @classmethod
    def rank_env(cls, cfg: Config) -> dict[str, str]:
        """Variables every rank gets for this engine (the plan's environment table)."""
        return {}

    @classmethod
    def grad_bucket_bytes(cls, cfg: Config) -> int:
        """The size of one group of gradients (fusion buffer or bucket), in bytes."""
        return 0

    @classmethod
    def buffer_bytes(cls, cfg: Config, layout: Layout, grad_bytes: int) -> int:
        """Memory the engine holds besides the model's tensors on a rank holding `grad_bytes` of
        gradients (its communication buffers), for the memory prediction (memory/predict.py)."""
        return 0

    @classmethod
    def needs_torch_store(cls, cfg: Config) -> bool:
        """Does the engine meet the other ranks through torch.distributed's store
        (MASTER_ADDR/MASTER_PORT, chosen by the launcher)?"""
        return False

    @classmethod
    def tune_knobs(cls, cfg: Config) -> list[Knob]:
        """The settings `hpctrain tune` searches for this engine, each with the values to try."""
        return []

    @classmethod
    def needs_mpi(cls, cfg: Config) -> bool:
        """Do the ranks need MPI (started by mpirun or srun's MPI plugin), or may they be spawned
        without it (launch/local/spawn.py)?"""
        return False

    @classmethod
    def needs_gloo_rendezvous(cls, cfg: Config) -> bool:
        """Does the engine meet the other ranks at Horovod's Gloo rendezvous server (started by
        the launcher)?"""
        return False

    # --- on the ranks ------------------------------------------------------------------------
    def __init__(self, run: EngineRun, own: S) -> None:
        self.run, self.own = run, own

    @abstractmethod
    def init(self, layout: Layout) -> RankInfo:
        """Join the world the launcher started; check its size against the plan's layout."""

    @abstractmethod
    def wrap(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[nn.Module, Any]:
        """The model to call and the optimizer to step, with gradient averaging attached."""

    def broadcast_initial(self, model: nn.Module) -> None:
        """A fresh start: every rank takes rank 0's weights (default: the wrapper did it already,
        as DDP's does). Never the optimizer's state: a fresh optimizer has none, and every rank
        built the same one; a resumed one was read from the same checkpoint on every rank."""
        return None

    def micro_batch(self, model: nn.Module, last: bool) -> AbstractContextManager[Any]:
        """Around one micro-batch's forward and backward (accumulation: only the last syncs)."""
        return contextlib.nullcontext()

    @abstractmethod
    def vote(self, flag: bool, step: int) -> Any:
        """Start agreeing on a stop (max over ranks); the handle goes to vote_result."""

    @abstractmethod
    def vote_result(self, handle: Any) -> bool:
        """The agreed stop of a vote `vote` started: True when any rank asked to stop."""

    def wait_gradients(self, optimizer: Any) -> Mark | None:
        """Block until the averaged gradients are in place (for the device: later work on the
        compute stream sees them). Returns the clock's mark (engine/clock.py) where the backward
        computation ended when the backward pass itself went on to wait for communication (DDP,
        FSDP), so the step counts what followed that mark as exposed communication; else None.
        The caller times the rest of this call as exposed communication too."""
        return None

    def optimizer_step(self, optimizer: Any, scaler: torch.amp.GradScaler | None) -> None:
        """Step the optimizer with the averaged gradients (through the gradient scaler, if any)."""
        step_optimizer(optimizer, scaler)

    @abstractmethod
    def barrier(self, name: str) -> None:
        """Wait until every rank reaches the barrier `name`."""

    @abstractmethod
    def allreduce_now(self, t: torch.Tensor, name: str) -> None:
        """A blocking sum over every rank, with the collective the engine averages gradients with."""

    @abstractmethod
    def allgather_object(self, obj: Any) -> list[Any]:
        """Every rank's `obj` (picklable), in rank order, on every rank."""

    @abstractmethod
    def environment(self) -> dict[str, Any]:
        """env.json's engine part: versions, build, what it runs on."""

    @abstractmethod
    def shutdown(self) -> None:
        """Leave the world at the end of the rank (idempotent)."""


class StageReplicas(ABC):
    """The capability hybrid parallelism needs: average a pipeline stage's gradients over its
    replicas (`group`: their torch process group) after the last micro-batch's backward pass."""

    @abstractmethod
    def wrap_stage(
        self, pieces: list[nn.Module], optimizer: torch.optim.Optimizer, group: Any
    ) -> tuple[list[nn.Module], Any]:
        """This rank's pipeline pieces (to run) and optimizer (to step)."""


class Sharding(ABC):
    """The capability sharded data parallelism (fsdp, hsdp) needs: shard a model's parameters,
    gradients and optimizer state over the layout's `replicate` x `shard` ranks. The optimizer is
    built afterwards, on the sharded parameters."""

    @abstractmethod
    def shard(self, model: nn.Module, layout: Layout, units: list[str], mesh: Any = None) -> nn.Module:
        """`model`, sharded in place (what to call, and what checkpoints save): the `units`
        (module or class names) one by one, then the rest. `mesh`: the data-parallel part of a
        larger device mesh (tensor parallelism's), or None for a mesh of the layout's own."""


class TensorParallel(ABC):
    """The capability tensor parallelism needs: a torch.distributed device mesh over the layout's
    dimensions, and a model split over one of them (by the dimension's own code, parallel/tensor/)."""

    @abstractmethod
    def device_mesh(self, layout: Layout) -> Any:
        """The mesh [pp x] replicate x shard x tp (dimension names as spelled; pp where the layout
        has pipeline stages), on this rank's device."""

    @abstractmethod
    def split(self, model: nn.Module, how: Callable[[nn.Module], nn.Module]) -> nn.Module:
        """`model`, split in place by `how` (its modules then hold this rank's slice, DTensors):
        what the engine must know of a model whose layers' collectives run inside forward and
        backward, not in its own gradient sync."""


class Timeline(ABC):
    """An engine that records its own timeline of collectives (Horovod's), for a profiler window."""

    @abstractmethod
    def start_timeline(self, path: Path) -> None:
        """Start writing the engine's own timeline of collectives to `path` (rank 0)."""

    @abstractmethod
    def stop_timeline(self) -> None:
        """Stop the timeline and close its file."""


def own_settings(engine: type[Engine[Any]], cfg: Config) -> Any:
    """The engine's own group of settings, read from the flat parallelism.* keys (or None)."""
    if engine.settings is None:
        return None
    return engine.settings(**{k: getattr(cfg.parallelism, k) for k in setting_keys(engine)})


def setting_keys(engine: type[Engine[Any]]) -> list[str]:
    return [f.name for f in dataclasses.fields(engine.settings)] if engine.settings else []


def foreign_settings(
    cfg: Config, engine: type[Engine[Any]], others: list[type[Engine[Any]]]
) -> list[Problem]:
    """Settings of another engine given to this one would silently do nothing: refuse them."""
    defaults, par, own = ParallelismConf(), cfg.parallelism, setting_keys(engine)
    p = []
    for other in others:
        for key in setting_keys(other):
            if key not in own and getattr(par, key) != getattr(defaults, key):
                mine = ", ".join(f"parallelism.{k}" for k in own) or "none"
                p.append(
                    Problem(
                        f"parallelism.{key}",
                        f"applies to engine={other.name} only",
                        f"set parallelism.engine={other.name}, or drop parallelism.{key} "
                        f"({engine.name}'s own settings: {mine})",
                    )
                )
    return p


def step_optimizer(optimizer: Any, scaler: torch.amp.GradScaler | None) -> None:
    """optimizer.step(), through the gradient scaler when fp16 uses one."""
    if scaler is not None:
        scaler.unscale_(optimizer)
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
