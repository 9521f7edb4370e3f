"""Config rules of pipelines (parallelism=pipeline | hybrid): at least two stages, the world a
multiple of them, micro-batches that divide each replica's batch and suit the schedule, a model
with enough split points. Each problem names the key, the rule and the fix."""

from __future__ import annotations

from hpctrain.config.layout import SCHEDULES
from hpctrain.config.schema import Config
from hpctrain.config.split import declared_split_points
from hpctrain.errors import Problem


def pipeline_problems(cfg: Config, world: int, one_replica: bool) -> list[Problem]:
    """`one_replica`: parallelism=pipeline (every stage on one rank), not hybrid."""
    par = cfg.parallelism
    if par.stages < 2:
        return [
            Problem(
                "parallelism.stages",
                f"a pipeline needs at least 2 stages (got {par.stages})",
                "set parallelism.stages=2 or more, or use parallelism=data",
            )
        ]
    p = _world_problems(cfg, world, one_replica)
    p += _schedule_problems(cfg)
    p += _split_problems(cfg)
    if par.backward_passes_per_step != 1:
        p.append(
            Problem(
                "parallelism.backward_passes_per_step",
                "a pipeline already accumulates its micro-batches' gradients",
                "use parallelism.microbatches instead, and set backward_passes_per_step=1",
            )
        )
    if par.compression != "none":
        p.append(
            Problem(
                "parallelism.compression",
                f"compresses a data-parallel gradient allreduce; parallelism={par.name} does not apply it",
                "drop parallelism.compression (precision=bf16 halves the activations sent between stages)",
            )
        )
    if cfg.precision.name == "fp16":
        p.append(
            Problem(
                "precision.name",
                "fp16 needs one loss-scale decision across all stages, which pipelines do not make yet",
                "use precision=bf16 (no loss scaling needed) or fp32",
            )
        )
    return p


def _world_problems(cfg: Config, world: int, one_replica: bool) -> list[Problem]:
    par = cfg.parallelism
    if world < 1:
        return []  # the cluster checks report it
    if world % par.stages:
        return [
            Problem(
                "parallelism.stages",
                f"stages x replicas must equal the world size: {world} ranks are not a multiple of "
                f"{par.stages} stages",
                f"use a world size that is a multiple of {par.stages}, or stages that divide {world}",
            )
        ]
    reps = world // par.stages
    if one_replica and reps != 1:
        return [
            Problem(
                "parallelism.stages",
                f"parallelism=pipeline needs one rank per stage: {world} ranks for {par.stages} stages "
                f"would make {reps} replicas",
                f"use parallelism=hybrid for {par.stages} stages x {reps} replicas, or set the world "
                f"size to {par.stages}",
            )
        ]
    return []


def _schedule_problems(cfg: Config) -> list[Problem]:
    par = cfg.parallelism
    p = []
    if par.microbatches < 1:
        return [Problem("parallelism.microbatches", f"must be >= 1 (got {par.microbatches})", "e.g. 4")]
    from hpctrain.parallel.registry import resolve_batch

    b = resolve_batch(cfg)
    if b.per_rank >= 1 and b.per_rank % par.microbatches:
        p.append(
            Problem(
                "parallelism.microbatches",
                f"{par.microbatches} micro-batches do not divide each replica's batch of {b.per_rank}",
                "choose microbatches that divide train.batch_per_rank (or global batch / replicas)",
            )
        )
    name = str(par.schedule)
    kind = SCHEDULES[name]
    if kind.one_in_flight_per_stage and par.microbatches < par.stages:
        p.append(
            Problem(
                "parallelism.microbatches",
                f"1F1B keeps one micro-batch in flight per stage: it needs microbatches >= stages "
                f"({par.microbatches} < {par.stages})",
                f"set parallelism.microbatches={par.stages} or more, or schedule=gpipe",
            )
        )
    if kind.pieces == "virtual" and par.virtual_stages < kind.min_virtual:
        p.append(
            Problem(
                "parallelism.virtual_stages",
                f"{name} gives each rank several model pieces (got {par.virtual_stages})",
                f"set parallelism.virtual_stages={kind.min_virtual} or more, or use schedule=1f1b",
            )
        )
    rounds = max(1, par.microbatches // par.stages)
    if kind.multi and par.microbatches % rounds:
        p.append(
            Problem(
                "parallelism.microbatches",
                f"{name} runs micro-batches in {rounds} equal rounds of about one per stage: "
                f"{par.microbatches} is not a multiple of {rounds}",
                f"set parallelism.microbatches to a multiple of {par.stages}",
            )
        )
    if kind.pieces != "virtual" and par.virtual_stages != 1:
        two = " (zbv always gives each rank two, in a V)" if kind.pieces == "two" else ""
        p.append(
            Problem(
                "parallelism.virtual_stages",
                f"only interleaved_1f1b and interleaved_zb put a chosen number of pieces on a rank "
                f"(schedule={name}){two}",
                "set parallelism.virtual_stages=1, or schedule=interleaved_1f1b",
            )
        )
    return p


def _builtin_cut(cfg: Config, given: list[str]) -> list[Problem]:
    """A built-in model can be cut only where it declares (a user model is checked on the ranks,
    where it is built): the names must be among those places, in forward order."""
    if cfg.model._target_:
        return []
    declared = declared_split_points(cfg.model)
    unknown = [n for n in given if n not in declared]
    if unknown:
        return [
            Problem(
                "parallelism.split_at",
                f"{unknown} are not places model {cfg.model.name} can be cut",
                f"choose from: {', '.join(declared)} (in forward order)",
            )
        ]
    if [declared.index(n) for n in given] != sorted(declared.index(n) for n in given):
        return [
            Problem(
                "parallelism.split_at",
                f"{given} is not in forward order",
                f"list them as the model runs them: {', '.join(n for n in declared if n in given)}",
            )
        ]
    return []


def _split_problems(cfg: Config) -> list[Problem]:
    par = cfg.parallelism
    pieces = par.stages * pieces_per_rank(cfg)  # replicas do not change the cut
    given = list(par.split_at)
    if given:
        if len(given) != pieces - 1:
            return [
                Problem(
                    "parallelism.split_at",
                    f"{len(given)} split point(s) make {len(given) + 1} pieces, the schedule needs "
                    f"{pieces} ({par.stages} stages x {pieces // max(par.stages, 1)} per rank)",
                    f"name {pieces - 1} module(s) where a piece begins, in forward order",
                )
            ]
        if len(set(given)) != len(given) or any(not n for n in given):
            return [
                Problem(
                    "parallelism.split_at",
                    f"{given} has an empty or repeated name",
                    "name distinct modules, in forward order",
                )
            ]
        return _builtin_cut(cfg, given)
    declared = declared_split_points(cfg.model)
    if cfg.model._target_:
        return [
            Problem(
                "parallelism.split_at",
                "your model does not declare where it may be cut",
                f"name {pieces - 1} module(s) where a stage begins, e.g. parallelism.split_at=[layer3]",
            )
        ]
    if len(declared) < pieces - 1:
        return [
            Problem(
                "parallelism.stages",
                f"model {cfg.model.name} can be cut in at most {len(declared) + 1} pieces "
                f"({', '.join(declared)}); {pieces} were asked for",
                "use fewer stages (or virtual_stages), or a deeper model (model.depth)",
            )
        ]
    return []


def pieces_per_rank(cfg: Config) -> int:
    """Model pieces each pipeline rank holds under the schedule (virtual stages, or two in a V)."""
    kind = SCHEDULES[str(cfg.parallelism.schedule)]
    return {"one": 1, "two": 2}.get(kind.pieces, max(cfg.parallelism.virtual_stages, 1))
