"""The shared mesh: how a sharded layout takes pipeline stages, pp x replicate x shard x tp on one
device mesh (parallelism=fsdp|hsdp parallelism.stages=N). Sharding asks here, and this module asks
the pipeline package; no other module outside parallel/pipeline/ imports it (tests/unit/test_house.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hpctrain.config.split import split_points
from hpctrain.errors import Problem
from hpctrain.parallel.pipeline.mesh_rules import mesh_stage_problems, whole_checkpoints_refused
from hpctrain.parallel.pipeline.rules import pieces_per_rank, pipeline_problems

if TYPE_CHECKING:
    from hpctrain.config.schema import Config
    from hpctrain.records import Layout
    from hpctrain.train.checkpoint import Restored
    from hpctrain.train.setup import Setup
    from hpctrain.train.step import Trainer


def stage_problems(cfg: Config, dp: int) -> tuple[list[Problem], list[Problem]]:
    """(the pipeline's own rules over `dp` data-parallel ranks, what a mesh's stages add)."""
    return pipeline_problems(cfg, dp, one_replica=False), mesh_stage_problems(cfg, sharded=True)


def pieces(cfg: Config) -> int:
    """Model pieces a rank holds under the configured schedule."""
    return pieces_per_rank(cfg)


def stage_note(cfg: Config, layout: Layout) -> str:
    par = cfg.parallelism
    return (
        f"pipeline: {layout.stages} stages of that mesh, {par.microbatches} micro-batches, schedule "
        f"{par.schedule}; the model is cut at {', '.join(split_points(cfg, layout.pieces))}"
    )


def resume_problems(cfg: Config, sharded_only: bool) -> list[Problem]:
    return whole_checkpoints_refused(cfg, sharded_only)


def staged_trainer(setup: Setup) -> tuple[Trainer, Restored]:
    """This rank's trainer of a pipeline over the mesh."""
    from hpctrain.parallel.pipeline.mesh import mesh_pipeline_trainer

    return mesh_pipeline_trainer(setup)
