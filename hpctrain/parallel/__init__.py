"""The parallelism axis: data (every rank holds the whole model), pipeline (stages across ranks),
hybrid (stages x data-parallel replicas), fsdp (every rank holds a shard) and hsdp (shard groups x
replicas). config/layout.py says which rank holds what (pure, derived from the config), split.py
where models are cut and what is sharded (pure), rules.py and shard_rules.py what is valid. What
runs on the ranks is in train/: pipeline.py and pipeline_step.py (stages, schedules), shard.py and
shard_checkpoint.py (FSDP2, sharded checkpoints)."""

from __future__ import annotations

from hpctrain.config.layout import SHARDED, describe_mesh, layout_for, shard_mesh
from hpctrain.config.schema import Config

__all__ = ["layout_for", "parallel_notes"]


def parallel_notes(cfg: Config, world: int, ranks_per_node: int) -> list[str]:
    """The plan's (and --dry-run's) account of which rank holds which stage on which node."""
    if cfg.parallelism.name == "data":
        return []
    if cfg.parallelism.name in SHARDED:
        return shard_notes(cfg, world, ranks_per_node)
    from hpctrain.config.layout import describe
    from hpctrain.parallel.split import split_points

    lay = layout_for(cfg, world)
    par = cfg.parallelism
    head = (
        f"{par.name}: {lay.stages} stages x {lay.replicas} replica(s), {par.microbatches} micro-batches, "
        f"schedule {par.schedule}; the model is cut at {', '.join(split_points(cfg, lay.pieces))}"
    )
    return [head, *describe(lay, ranks_per_node)]


def shard_notes(cfg: Config, world: int, ranks_per_node: int) -> list[str]:
    from hpctrain.parallel.split import shard_units

    mesh, sh = shard_mesh(cfg, world, ranks_per_node), cfg.parallelism.shard
    units = shard_units(cfg.model, list(sh.modules))
    what = (
        f"units {', '.join(units)}, then the rest of the model"
        if units
        else "the model as one unit (name blocks in parallelism.shard.modules to gather one at a time)"
    )
    head = (
        f"{cfg.parallelism.name}: mesh {mesh.replicate} replica group(s) x {mesh.shard} shards; shards "
        f"{what}; reshard_after_forward={sh.reshard_after_forward}"
        + ("; parameters and optimizer state offloaded to host memory" if sh.cpu_offload else "")
    )
    return [head, *describe_mesh(mesh, world, ranks_per_node)]
