"""The parallelism axis: data (every rank holds the whole model), pipeline (stages across ranks)
and hybrid (stages x data-parallel replicas). layout.py says which rank holds what (pure),
split.py where models are cut (pure), rules.py what is valid. What runs on the ranks is in
train/: pipeline.py (stages, schedules, checkpoints of the whole model) and pipeline_step.py."""

from __future__ import annotations

from ..config.schema import Config
from .layout import Layout


def layout_for(cfg: Config, world: int) -> Layout:
    """Data parallelism is the one-stage case: every rank a replica of the whole model."""
    par = cfg.parallelism
    if par.name == "data":
        return Layout(1, world)
    stages = max(par.stages, 1)
    virtual = par.virtual_stages if par.schedule == "interleaved_1f1b" else 1
    return Layout(stages, max(world // stages, 1), virtual)


def parallel_notes(cfg: Config, world: int, ranks_per_node: int) -> list[str]:
    """The plan's (and --dry-run's) account of which rank holds which stage on which node."""
    if cfg.parallelism.name == "data":
        return []
    from .layout import describe
    from .split import split_points

    lay = layout_for(cfg, world)
    par = cfg.parallelism
    head = (
        f"{par.name}: {lay.stages} stages x {lay.replicas} replica(s), {par.microbatches} micro-batches, "
        f"schedule {par.schedule}; the model is cut at {', '.join(split_points(cfg, lay.pieces))}"
    )
    return [head, *describe(lay, ranks_per_node)]
