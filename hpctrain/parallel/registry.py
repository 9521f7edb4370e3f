"""Parallelisms by name, as engines are (engine/registry.py). `parallelism=<name>` picks one.

Adding a parallelism: a module with a class that implements parallel.base.ParallelismKind, and
one line in PARALLELISMS below (or register_parallelism from a test, or an entry point in the
group "hpctrain.parallelisms" of another installed package: hpctrain/registry.py). Its rules,
layout, notes, summary fields and trainer are that class's; nothing else changes.

Also here: what follows from the chosen parallelism for the whole run, derived once at plan time
(the layout, the batch per replica, the learning rate) and written to plan.json.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hpctrain.config.derived import Derived, target_lr, world_size
from hpctrain.errors import Problem
from hpctrain.records import Batch
from hpctrain.registry import Registry

if TYPE_CHECKING:
    from hpctrain.config.schema import Config
    from hpctrain.parallel.base import ParallelismKind
    from hpctrain.records import Layout

# name -> "module:Class"; imported on first use
PARALLELISMS: dict[str, str] = {
    "data": "hpctrain.parallel.data.kind:Data",
    "pipeline": "hpctrain.parallel.pipeline.kind:Pipeline",
    "hybrid": "hpctrain.parallel.pipeline.kind:Hybrid",
    "fsdp": "hpctrain.parallel.sharded.kind:Fsdp",
    "hsdp": "hpctrain.parallel.sharded.kind:Hsdp",
}
_REGISTRY: Registry[ParallelismKind] = Registry(
    "parallelism", PARALLELISMS, "hpctrain.parallelisms", base="hpctrain.parallel.base:ParallelismKind"
)


def parallelism_names() -> list[str]:
    """The built-in parallelisms, then those other installed packages register (entry points)."""
    return _REGISTRY.names()


def register_parallelism(name: str, target: str) -> None:
    """Make `target` ("package.module:Class") available as parallelism=`name`."""
    _REGISTRY.register(name, target)


def unknown_parallelism(key: str, name: str) -> Problem:
    return _REGISTRY.unknown(key, name)


def parallelism_class(name: str) -> type[ParallelismKind]:
    return _REGISTRY.get(name, "parallelism.name")


def kind_of(cfg: Config) -> type[ParallelismKind]:
    return parallelism_class(str(cfg.parallelism.name))


def node_size(cfg: Config) -> int:
    """Ranks per node as the cluster config counts them (local: the world)."""
    return max(int(cfg.cluster.node_size), 1)


def layout_of(cfg: Config, world: int | None = None) -> Layout:
    """The layout at `world` ranks (default: the cluster config's world size)."""
    n = world_size(cfg) if world is None else world
    return kind_of(cfg).layout(cfg, n, min(node_size(cfg), max(n, 1)))


def resolve_batch(cfg: Config, world: int | None = None) -> Batch:
    """Per-replica and global batch from whichever of the two the user set (validated first). A
    replica is a data-parallel rank (or group of tensor-parallel ranks, or a whole pipeline); its
    batch is cut into the parallelism's micro-batches."""
    n = layout_of(cfg, world).replicas
    per = cfg.train.batch_per_rank
    if per is None:
        per = (cfg.train.global_batch or 0) // max(n, 1)
    return Batch(per, per * n, per // max(kind_of(cfg).batch_cuts(cfg), 1))


def derive(cfg: Config) -> Derived:
    n = world_size(cfg)
    batch = resolve_batch(cfg, n)
    return Derived(n, batch, target_lr(cfg.optim, batch.global_, batch.per_rank), layout_of(cfg, n))
