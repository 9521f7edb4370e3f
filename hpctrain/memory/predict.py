"""A point's peak memory per rank, predicted before anything starts, and the refusal of a point
that cannot fit, with the change that would fit it.

The prediction adds, for the first rank of every pipeline stage (the others of a stage hold the
same): the traced step's peak (memory/trace.py: parameters, gradients and optimizer state as the
layout holds them, activations and temporaries, FSDP's gathered units), the engine's buffers
(Engine.buffer_bytes: DDP's buckets, Horovod's fusion buffer), the dataset the rank keeps in its
process (CPUs), and the process's fixed cost (memory/fixed.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from hpctrain.analysis.memory import (
    MEMORY_BAND,
    Fixed,
    Limit,
    Prediction,
    RankMemory,
    gib,
    needed,
    over,
    parts_text,
)
from hpctrain.config.schema import Config
from hpctrain.config.split import declared_checkpoint_blocks
from hpctrain.engine.registry import engine_class
from hpctrain.errors import ConfigError, Problem
from hpctrain.memory.fixed import fixed_cost
from hpctrain.memory.trace import trace_rank
from hpctrain.parallel.dimensions import memory_fixes as dimension_fixes
from hpctrain.parallel.registry import derive, kind_of


def predict(cfg: Config, gpus: bool, fixed: Fixed | None = None) -> Prediction:
    """Every stage's first rank's predicted peak (one rank where there are no stages); `fixed`:
    the process's own cost as already measured (else measured or read from the cache)."""
    d = derive(cfg)
    layout = d.layout
    engine = engine_class(str(cfg.parallelism.engine))
    fixed = fixed or fixed_cost(cfg, gpus)
    per_stage = layout.world_size // layout.stages
    out = []
    for rank in range(0, layout.world_size, per_stage):
        t = trace_rank(cfg, d, rank)
        p = t.parts
        out.append(
            RankMemory(
                rank=rank,
                stage=layout.stage_of(rank),
                params=p["params"],
                grads=p["grads"],
                optimizer=p["optimizer"],
                activations=p["activations"],
                buffers=p["buffers"] + engine.buffer_bytes(cfg, layout, t.trainable),
                data=0 if gpus else t.data,  # on GPUs the dataset stays in host memory
                fixed=fixed.bytes,
                fixed_in_peak=not gpus,
            )
        )
    how = f"traced with fake tensors in a world of {layout.world_size}; the fixed cost {fixed.how}"
    return Prediction(tuple(out), how, fixed)


def fixes(cfg: Config, accept: Callable[[Config], bool]) -> list[tuple[str, Config]]:
    """Changes that lower a rank's memory, cheapest to the run first: recomputing activations,
    the parallelism's own (sharding, smaller micro-batches), splitting over twice the
    tensor-parallel ranks, half the batch per rank. Only those `accept`ed (the run's rules)."""
    world = int(cfg.cluster.world_size)
    found: list[tuple[str, Config]] = []
    if not cfg.model.activation_checkpointing and declared_checkpoint_blocks(cfg.model):
        found.append(
            (
                "model.activation_checkpointing=true",
                replace(cfg, model=replace(cfg.model, activation_checkpointing=True)),
            )
        )
    elif not cfg.model.activation_checkpointing and (blocks := repeated_blocks(cfg)):
        listed = ",".join(blocks)
        recompute = replace(cfg.model, activation_checkpointing=True, checkpoint_blocks=blocks)
        found.append(
            (
                f"model.activation_checkpointing=true 'model.checkpoint_blocks=[{listed}]'",
                replace(cfg, model=recompute),
            )
        )
    found += kind_of(cfg).memory_fixes(cfg, world)
    found += dimension_fixes(cfg, world)
    per, whole = cfg.train.batch_per_rank, cfg.train.global_batch
    if per and per >= 2:
        found.append(
            (
                f"train.batch_per_rank={per // 2}",
                replace(cfg, train=replace(cfg.train, batch_per_rank=per // 2)),
            )
        )
    elif per is None and whole and whole % 2 == 0:  # given as the global batch (as studies give it)
        found.append(
            (
                f"train.global_batch={whole // 2}",
                replace(cfg, train=replace(cfg.train, global_batch=whole // 2)),
            )
        )
    return [(text, c) for text, c in found if accept(c)]


def repeated_blocks(cfg: Config) -> list[str]:
    """A user model's repeated blocks, what activation checkpointing recomputes one at a time: the
    children of each outermost ModuleList or Sequential of two or more modules of one class, as a
    pattern (transformer.h.*); [] for a built-in model (it declares its own) or none found."""
    import torch
    from torch import nn

    from hpctrain.train.parts import make_model
    from hpctrain.train.targets import importable

    if not cfg.model._target_:
        return []
    try:
        with importable(cfg.code.dir), torch.device("meta"):
            model = make_model(cfg)
    except Exception:  # noqa: BLE001 - not buildable here: no suggestion
        return []
    found: list[str] = []
    for name, m in model.named_modules():
        same = isinstance(m, nn.ModuleList | nn.Sequential) and len(m) >= 2 and len({type(c) for c in m}) == 1
        if same and name and not any(name.startswith(f[:-1]) for f in found):
            found.append(f"{name}.*")
    return found


def check_fits(cfg: Config, limit: Limit, gpus: bool, accept: Callable[[Config], bool]) -> Prediction:
    """The point's prediction; ConfigError (exit 2) when its worst rank exceeds `limit`, naming
    the prediction, the limit and the first change that the same prediction says would fit."""
    p = predict(cfg, gpus)
    if not over(p, limit):
        return p
    w = p.worst
    fit = ""
    for text, changed in fixes(cfg, accept):
        # with the point's own fixed cost: another parallelism's probe would cost seconds for a
        # hint within a few per cent (the changed point is checked in full when it is submitted)
        if not over(predict(changed, gpus, p.fixed), limit):
            fit = text
            break
    where = f"rank {w.rank}" + (f" (stage {w.stage})" if p.ranks[-1].stage else "")
    rule = (
        f"{where} is predicted to need {gib(w.peak)} ({parts_text(w)}), {gib(needed(w))} with the "
        f"prediction's {MEMORY_BAND:.0%} error band, more than the {gib(limit.bytes)} each rank has ({limit.source})"
    )
    hint = (
        f"{fit} would fit (predicted the same way)"
        if fit
        else "none of activation checkpointing, sharding, tensor parallelism, more micro-batches or half "
        "the batch per rank fits it alone: use more ranks or a smaller model"
    )
    raise ConfigError([Problem(limit.key, rule, hint)])
