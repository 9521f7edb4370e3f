"""parallelism=fsdp | hsdp: PyTorch's FSDP2 (fully_shard) over a device mesh. fsdp shards every
parameter, gradient and optimizer state over the whole world (ZeRO-3); hsdp shards them inside
groups of parallelism.shard.degree ranks (by default one node's) and replicates the groups.

The mesh is replicate x shard; rank r holds shard r % degree of replica group r // degree
(records.Layout), so a shard group is consecutive ranks and stays inside a node when the degree
divides the ranks per node (HSDP's usual layout: the all-gathers and reduce-scatters of every
block stay on the node, and only the replicas' gradient all-reduce crosses nodes)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, ClassVar

from hpctrain.analysis.tune import Knob, divisors
from hpctrain.config.layout import SCHEDULES, describe_mesh
from hpctrain.config.schema import PipelineSettings, ShardHolder, TpHolder
from hpctrain.config.split import shard_units
from hpctrain.engine.base import Sharding
from hpctrain.errors import Problem
from hpctrain.parallel import mesh
from hpctrain.parallel.base import ParallelismKind
from hpctrain.parallel.dimensions import (
    inner_dims,
    inner_ranks,
    split_degree,
    split_notes,
    split_problems,
    split_shard_problems,
)
from hpctrain.parallel.registry import node_size
from hpctrain.parallel.sharded.figures import ShardFigures
from hpctrain.parallel.sharded.rules import shard_problems
from hpctrain.records import Layout

if TYPE_CHECKING:
    from hpctrain.config.schema import Config
    from hpctrain.facts import HostFacts
    from hpctrain.train.checkpoint import Restored
    from hpctrain.train.setup import Setup
    from hpctrain.train.step import Trainer


class Fsdp(ParallelismKind):
    """One shard group: the whole world (of each pipeline stage, with parallelism.stages)."""

    settings = (ShardHolder, TpHolder, PipelineSettings)
    needs = Sharding
    torch_store = True  # the mesh's process groups
    builtin_only = True
    whole_world: ClassVar[bool] = True
    takes_dims = True

    @classmethod
    def tune_knobs(cls, cfg: Config, engine: list[Knob]) -> list[Knob]:
        # the units' collectives are FSDP's own, not the engine's buckets or compression; tensor
        # parallelism inside a node (2-D), over degrees the node's ranks divide into
        return [
            Knob("parallelism.shard.reshard_after_forward", (True, False)),
            Knob("parallelism.tp.degree", divisors(node_size(cfg))),
        ]

    @classmethod
    def degree(cls, cfg: Config, world: int, ranks_per_node: int) -> int:
        """parallelism.shard.degree as given; null: every data-parallel rank (fsdp) or one node's
        (hsdp). With tensor parallelism the data-parallel ranks are the world / tp.degree."""
        given, tp = cfg.parallelism.shard.degree, split_degree(cfg)
        if given is not None:
            return int(given)
        dp = max(world // tp // _stages(cfg) // inner_ranks(cfg), 1)
        return dp if cls.whole_world else min(max(ranks_per_node // tp, 1), dp)

    @classmethod
    def layout(cls, cfg: Config, world: int, ranks_per_node: int) -> Layout:
        degree, tp, stages = max(cls.degree(cfg, world, ranks_per_node), 1), split_degree(cfg), _stages(cfg)
        piped, dims = stages > 1, inner_dims(cfg)
        return Layout(
            stages=stages,
            replicate=max(world // tp // stages // degree // math.prod(dims.values()), 1),
            shard=degree,
            tp=tp,
            dims=dims,
            virtual=mesh.pieces(cfg) if piped else 1,
            v_shape=piped and SCHEDULES[str(cfg.parallelism.schedule)].pieces == "two",
        )

    @classmethod
    def problems(cls, cfg: Config, world: int, facts: HostFacts | None) -> list[Problem]:
        node, tp, par = node_size(cfg), split_degree(cfg), cfg.parallelism
        p, inner = split_problems(cfg, world), inner_ranks(cfg)
        # the data-parallel ranks (of every stage, and of each position along the named dimensions,
        # whose own rules judge whether they divide the world) ...
        dp = world // tp // inner if not p and world % (tp * inner) == 0 else world
        if par.stages != 1:  # ... which a pipeline's stages divide (3-D: PP x FSDP x TP)
            piped, staged = mesh.stage_problems(cfg, dp)
            p += piped + staged
            if piped:
                return p  # the shard degree is judged once the stages fit
            dp //= par.stages
        degree = cls.degree(cfg, world, node)
        fused = split_shard_problems(cfg) if degree > 1 and tp > 1 else []
        return p + fused + shard_problems(cfg, dp, degree, cls.whole_world, facts)

    @classmethod
    def notes(cls, cfg: Config, layout: Layout, ranks_per_node: int) -> list[str]:
        sh = cfg.parallelism.shard
        units = shard_units(cfg.model, list(sh.modules))
        what = (
            f"units {', '.join(units)}, then the rest of the model"
            if units
            else "the model as one unit (name blocks in parallelism.shard.modules to gather one at a time)"
        )
        head = (
            f"{cls.name}: mesh {layout.replicate} replica group(s) x {layout.shard} shards; shards "
            f"{what}; reshard_after_forward={sh.reshard_after_forward}"
            + ("; parameters and optimizer state offloaded to host memory" if sh.cpu_offload else "")
            + (
                f"; sharded over each shard's {layout.inner} ranks along {' x '.join(layout.dims)} too "
                f"({layout.shard * layout.inner} ranks a group)"
                if layout.inner > 1
                else ""
            )
        )
        tp = split_notes(cfg, layout)
        pp = [mesh.stage_note(cfg, layout)] if layout.pipelined else []
        return [head, *pp, *tp, *describe_mesh(layout, ranks_per_node)]

    @classmethod
    def about(cls, cfg: Config, layout: Layout, grads: dict[str, object]) -> dict[str, object]:
        """FSDP's units group the gradients (grad_tensors counts them), not the engine's buckets."""
        parts = {ShardFigures.KEY: {"degree": layout.shard}}  # after the dimensions' (rank.py)
        return {**grads, "parts": parts, "grad_grouping": "shards", "grad_bucket_bytes": 0}

    @classmethod
    def batch_cuts(cls, cfg: Config) -> int:
        """A pipeline's micro-batches, else the engine's accumulation."""
        par = cfg.parallelism
        return int(par.microbatches if par.stages > 1 else par.backward_passes_per_step)

    @classmethod
    def memory_probe(cls, cfg: Config) -> tuple[str, ...]:
        return ("parallelism=fsdp",)  # hsdp's replicas need more ranks; the libraries are the same

    @classmethod
    def resume_problems(cls, cfg: Config, sharded_only: bool) -> list[Problem]:
        return mesh.resume_problems(cfg, sharded_only) if _stages(cfg) > 1 else []

    @classmethod
    def engine_refusal(cls, engine: str, able: list[str]) -> Problem:
        return Problem(
            "parallelism.engine",
            f"parallelism={cls.name} shards with torch.distributed's FSDP2; engine {engine} cannot "
            "shard a model",
            f"set parallelism.engine to one of: {', '.join(able)} (or use parallelism=data with {engine})",
        )

    @classmethod
    def build(cls, setup: Setup) -> tuple[Trainer, Restored]:
        if setup.d.layout.pipelined:
            return mesh.staged_trainer(setup)
        from hpctrain.train.mesh_trainer import sharded_trainer

        return sharded_trainer(setup)


class Hsdp(Fsdp):
    """Shard groups (one node's ranks by default) x replicas of them."""

    whole_world = False

    @classmethod
    def tune_knobs(cls, cfg: Config, engine: list[Knob]) -> list[Knob]:
        # how many ranks one shard group spans: fewer, more replicas (less state each gathers)
        world = int(cfg.cluster.world_size)
        return [*super().tune_knobs(cfg, engine), Knob("parallelism.shard.degree", divisors(world))]


def _stages(cfg: Config) -> int:
    """Pipeline stages of the mesh (parallelism.stages; 1: none)."""
    return max(int(cfg.parallelism.stages), 1)
