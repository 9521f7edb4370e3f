"""parallelism=pipeline | hybrid: the model cut into stages across ranks
(torch.distributed.pipelining), each replica's batch cut into micro-batches in flight at once;
hybrid adds data-parallel replicas of every stage, averaged by the engine.

The world is stages x replicas ranks; rank r holds stage r // replicas as replica r % replicas
(records.Layout), so a stage's replicas share a node and the allreduce of its gradients stays on
it. Interleaved schedules give each rank several pieces; zbv two, in a V (config/layout.py)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, ClassVar

from hpctrain.analysis.tune import Knob
from hpctrain.config.layout import SCHEDULES, describe, describe_mesh
from hpctrain.config.schema import PipelineSettings, TpHolder
from hpctrain.config.split import split_points
from hpctrain.engine.base import StageReplicas
from hpctrain.engine.registry import engine_class, engine_names
from hpctrain.errors import Problem
from hpctrain.parallel.base import ParallelismKind
from hpctrain.parallel.dimensions import split_degree, split_notes, split_problems
from hpctrain.parallel.pipeline.mesh_rules import mesh_stage_problems, whole_checkpoints_refused
from hpctrain.parallel.pipeline.rules import pieces_per_rank, pipeline_problems
from hpctrain.records import Layout

if TYPE_CHECKING:
    from hpctrain.config.schema import Config
    from hpctrain.facts import HostFacts
    from hpctrain.train.checkpoint import Restored
    from hpctrain.train.setup import Setup
    from hpctrain.train.step import Trainer


# the micro-batch counts `hpctrain tune` tries (those that do not divide the batch are left out)
MICROBATCHES = (1, 2, 4, 8, 16)


class Pipeline(ParallelismKind):
    """One rank per stage: one replica."""

    settings = (PipelineSettings, TpHolder)
    one_replica: ClassVar[bool] = True
    torch_store = True  # stages talk point to point over torch.distributed whatever the engine
    builtin_only = True
    compiles = False  # its stages are traced pieces: train.compile is refused (parallel/rules.py)

    @classmethod
    def layout(cls, cfg: Config, world: int, ranks_per_node: int) -> Layout:
        stages, tp = max(cfg.parallelism.stages, 1), split_degree(cfg)
        return Layout(
            stages=stages,
            replicate=max(world // tp // stages, 1),
            tp=tp,
            virtual=pieces_per_rank(cfg),
            v_shape=SCHEDULES[str(cfg.parallelism.schedule)].pieces == "two",
        )

    @classmethod
    def problems(cls, cfg: Config, world: int, facts: HostFacts | None) -> list[Problem]:
        """With parallelism.tp.degree, each stage split over a tensor-parallel group (the world is
        stages x replicas x tp)."""
        p = split_problems(cfg, world) if cfg.parallelism.tp.degree != 1 else []
        tp = split_degree(cfg)
        dp = world // tp if world % tp == 0 else world
        return p + pipeline_problems(cfg, dp, one_replica=cls.one_replica) + mesh_stage_problems(cfg, False)

    @classmethod
    def notes(cls, cfg: Config, layout: Layout, ranks_per_node: int) -> list[str]:
        par = cfg.parallelism
        head = (
            f"{cls.name}: {layout.stages} stages x {layout.replicas} replica(s), {par.microbatches} "
            f"micro-batches, schedule {par.schedule}; the model is cut at "
            f"{', '.join(split_points(cfg, layout.pieces))}"
        )
        if layout.tp > 1:
            return [head, *split_notes(cfg, layout), *describe_mesh(layout, ranks_per_node)]
        return [head, *describe(layout, ranks_per_node)]

    @classmethod
    def batch_cuts(cls, cfg: Config) -> int:
        return int(cfg.parallelism.microbatches)

    @classmethod
    def memory_probe(cls, cfg: Config) -> tuple[str, ...]:
        # point to point over torch.distributed whatever the engine; one rank per stage
        return ("parallelism=pipeline", "parallelism.stages=2", "parallelism.microbatches=1")

    @classmethod
    def memory_fixes(cls, cfg: Config, world: int) -> list[tuple[str, Config]]:
        # smaller micro-batches: each holds less, and GPipe holds them all
        m, per = 2 * cfg.parallelism.microbatches, cfg.train.batch_per_rank
        if not per or per % m:
            return []
        return [
            (
                f"parallelism.microbatches={m}",
                replace(cfg, parallelism=replace(cfg.parallelism, microbatches=m)),
            )
        ]

    @classmethod
    def study_overrides(cls, cfg: Config, world: int) -> tuple[str, ...]:
        # one replica: its stages grow with the scale (each split over its tensor-parallel group)
        return (f"parallelism.stages={world // split_degree(cfg)}",)

    @classmethod
    def tune_knobs(cls, cfg: Config, engine: list[Knob]) -> list[Knob]:
        # one replica: no gradients to average, only how the pipeline is filled
        return [
            Knob("parallelism.microbatches", MICROBATCHES),
            Knob("parallelism.schedule", tuple(SCHEDULES)),
        ]

    @classmethod
    def resume_problems(cls, cfg: Config, sharded_only: bool) -> list[Problem]:
        """A pipeline's stages load whole tensors with the optimizer state by index; sharded
        checkpoints (.dcp) hold it by parameter name, resharded only into a data layout."""
        if split_degree(cfg) > 1:  # tensor-parallel stages read sharded checkpoints (by name) only
            return whole_checkpoints_refused(cfg, sharded_only)
        if not sharded_only:
            return []
        return [
            Problem(
                "train.resume_from",
                f"{cfg.train.resume_from} holds only sharded checkpoints (fsdp/hsdp), which a pipeline "
                "cannot resume from",
                "resume it with parallelism=fsdp (or data), or start the pipeline without train.resume_from",
            )
        ]

    @classmethod
    def build(cls, setup: Setup) -> tuple[Trainer, Restored]:
        if setup.d.layout.tp > 1:
            from hpctrain.parallel.pipeline.mesh import mesh_pipeline_trainer

            return mesh_pipeline_trainer(setup)
        from hpctrain.parallel.pipeline.setup import pipeline_trainer

        return pipeline_trainer(setup)


class Hybrid(Pipeline):
    """Stages x data-parallel replicas: the engine averages each stage over its replicas."""

    needs = StageReplicas
    one_replica = False

    @classmethod
    def tune_knobs(cls, cfg: Config, engine: list[Knob]) -> list[Knob]:
        return [*Pipeline.tune_knobs(cfg, engine), *engine]

    @classmethod
    def problems(cls, cfg: Config, world: int, facts: HostFacts | None) -> list[Problem]:
        p = super().problems(cfg, world, facts)
        schedule, engine = str(cfg.parallelism.schedule), str(cfg.parallelism.engine)
        hooks = engine in engine_names() and engine_class(engine).reduces_in_hooks
        if SCHEDULES[schedule].split_backward and hooks:
            # an engine that reduces in hooks on the gradients' accumulation is never called by a
            # backward split into input and weight gradients (torch.autograd.grad): replicas drift
            p.append(
                Problem(
                    "parallelism.schedule",
                    f"{schedule} splits the backward into input and weight gradients, which engine "
                    f"{engine}'s gradient hooks do not see: a stage's replicas would not be averaged",
                    "use parallelism.engine=horovod (it averages at the optimizer step), or schedule=1f1b",
                )
            )
        return p

    @classmethod
    def engine_refusal(cls, engine: str, able: list[str]) -> Problem:
        return Problem(
            "parallelism.engine",
            f"engine {engine} cannot average a pipeline stage over its replicas (hybrid)",
            f"use parallelism=pipeline, or one of these engines: {', '.join(able)}",
        )
