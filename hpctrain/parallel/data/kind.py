"""parallelism=data: every rank holds the whole model and a slice of the global batch; the engine
averages the gradients (Horovod's ring-allreduce, or DDP's buckets). With parallelism.tp.degree,
each replica is split over a group of that many consecutive ranks (the world / tp.degree
replicas, averaged over the mesh's replicate dimension by FSDP2 with one shard: TP with DDP-like
replicas; one replica when tp.degree is the world: pure tensor parallelism)."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING

from hpctrain.config.layout import describe_mesh
from hpctrain.config.schema import TpHolder
from hpctrain.errors import Problem
from hpctrain.parallel.base import ParallelismKind
from hpctrain.parallel.dimensions import inner_dims, split_degree, split_notes, split_problems
from hpctrain.records import Layout

if TYPE_CHECKING:
    from hpctrain.config.schema import Config
    from hpctrain.facts import HostFacts
    from hpctrain.train.checkpoint import Restored
    from hpctrain.train.setup import Setup
    from hpctrain.train.step import Trainer


class Data(ParallelismKind):
    settings = (TpHolder,)
    takes_dims = True

    @classmethod
    def layout(cls, cfg: Config, world: int, ranks_per_node: int) -> Layout:
        tp, dims = split_degree(cfg), inner_dims(cfg)
        return Layout(replicate=max(world // tp // math.prod(dims.values()), 1), tp=tp, dims=dims)

    @classmethod
    def problems(cls, cfg: Config, world: int, facts: HostFacts | None) -> list[Problem]:
        tp = split_degree(cfg)
        p = split_problems(cfg, world)
        if tp > 1 and cfg.script.path:
            p.append(
                Problem(
                    "parallelism.tp.degree",
                    "tensor parallelism splits hpctrain's model; a script runs its own training",
                    "drop parallelism.tp.degree, or use a model._target_ with the built-in trainer",
                )
            )
        return p

    @classmethod
    def notes(cls, cfg: Config, layout: Layout, ranks_per_node: int) -> list[str]:
        return [*split_notes(cfg, layout), *describe_mesh(layout, ranks_per_node)] if layout.tp > 1 else []

    @classmethod
    def memory_probe(cls, cfg: Config) -> tuple[str, ...]:
        return (f"parallelism={cls.name}", *(("parallelism.tp.degree=2",) if split_degree(cfg) > 1 else ()))

    @classmethod
    def memory_fixes(cls, cfg: Config, world: int) -> list[tuple[str, Config]]:
        if world < 2:
            return []
        # the same ranks sharding parameters, gradients and optimizer state (ZeRO-3) instead
        return [("parallelism=fsdp", replace(cfg, parallelism=replace(cfg.parallelism, name="fsdp")))]

    @classmethod
    def about(cls, cfg: Config, layout: Layout, grads: dict[str, object]) -> dict[str, object]:
        if layout.tp == 1:
            return grads
        grouping = "shards" if layout.replicas > 1 else "none"  # FSDP2's units average the replicas
        return {**grads, "grad_grouping": grouping, "grad_bucket_bytes": 0}

    @classmethod
    def build(cls, setup: Setup) -> tuple[Trainer, Restored]:
        from hpctrain.train.mesh_trainer import sharded_trainer, tensor_parallel_trainer
        from hpctrain.train.setup import data_parallel_trainer

        layout = setup.d.layout
        if layout.tp > 1:
            # replicas of a split model (or ranks along a named dimension, which average their
            # gradients as replicas do): the mesh's data-parallel dimensions, averaged as HSDP's are
            many = layout.replicas * layout.inner > 1
            return sharded_trainer(setup) if many else tensor_parallel_trainer(setup)
        return data_parallel_trainer(setup)
