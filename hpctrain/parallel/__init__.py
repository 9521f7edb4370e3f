"""The parallelism axis: data (every rank holds the whole model), pipeline (stages across ranks)
and hybrid (stages x data-parallel replicas). config/layout.py says which rank holds what (pure,
derived from the config), split.py where models are cut (pure), rules.py what is valid. What runs on the ranks is in
train/: pipeline.py (stages, schedules, checkpoints of the whole model) and pipeline_step.py."""

from __future__ import annotations

from hpctrain.config.layout import layout_for
from hpctrain.config.schema import Config

__all__ = ["layout_for", "parallel_notes"]


def parallel_notes(cfg: Config, world: int, ranks_per_node: int) -> list[str]:
    """The plan's (and --dry-run's) account of which rank holds which stage on which node."""
    if cfg.parallelism.name == "data":
        return []
    from hpctrain.config.layout import describe
    from hpctrain.parallel.split import split_points

    lay = layout_for(cfg, world)
    par = cfg.parallelism
    head = (
        f"{par.name}: {lay.stages} stages x {lay.replicas} replica(s), {par.microbatches} micro-batches, "
        f"schedule {par.schedule}; the model is cut at {', '.join(split_points(cfg, lay.pieces))}"
    )
    return [head, *describe(lay, ranks_per_node)]
