"""Config rules every parallelism shares, then the chosen one's own (its class's `problems`): a
known name, settings of another parallelism refused (they would do nothing), the engine able to
do what the parallelism needs, a batch the replicas divide, blocks to recompute. Each problem
names the key, the rule and the fix."""

from __future__ import annotations

import dataclasses
from typing import Any

from hpctrain.config.derived import world_size
from hpctrain.config.options import DIGITS_TRAIN
from hpctrain.config.resume import resume_checkpoints
from hpctrain.config.schema import Config
from hpctrain.config.split import declared_checkpoint_blocks
from hpctrain.config.values import dotted
from hpctrain.engine.registry import engines_with, lacks
from hpctrain.errors import ConfigError, Problem
from hpctrain.facts import HostFacts
from hpctrain.parallel.base import ParallelismKind
from hpctrain.parallel.dimensions import dimension_problems
from hpctrain.parallel.registry import (
    layout_of,
    parallelism_class,
    parallelism_names,
    resolve_batch,
    unknown_parallelism,
)


def parallelism_problems(cfg: Config, world: int, facts: HostFacts | None = None) -> list[Problem]:
    name = str(cfg.parallelism.name)
    if name not in parallelism_names():
        return [unknown_parallelism("parallelism.name", name)]
    kind = parallelism_class(name)
    options = options_problems(cfg, kind)
    if options:  # its own rules read its options
        return options
    p = _checkpointing_problems(cfg) + foreign_settings(cfg, kind) + _engine_problems(cfg, kind)
    if kind.builtin_only and cfg.script.path:
        p.append(
            Problem(
                "parallelism.name",
                f"parallelism={name} changes how hpctrain's trainer holds the model; a script runs "
                "its own training",
                "use parallelism=data with script=..., or a model._target_ with the built-in trainer",
            )
        )
    if cfg.train.compile and (cfg.script.path or not kind.compiles or cfg.parallelism.stages > 1):
        p.append(
            Problem(
                "train.compile",
                "compiles the built-in trainer's model block by block; "
                + (
                    "a script runs its own training"
                    if cfg.script.path
                    else "pipeline stages are not compiled yet"
                ),
                "drop train.compile"
                + ("" if cfg.script.path else " for pipelines (fsdp, hsdp and data with tp compile)"),
            )
        )
    found = resume_checkpoints(cfg)  # a parallelism may not read every checkpoint format
    if found:
        p += kind.resume_problems(cfg, sharded_only=all(f.suffix == ".dcp" for f in found))
    dims = dimension_problems(cfg, world, name, kind.takes_dims)
    return p + dims + kind.problems(cfg, world, facts) + batch_problems(cfg)


def options_problems(cfg: Config, kind: type[ParallelismKind]) -> list[Problem]:
    """parallelism.options: only for a parallelism that declares them, each one it has, typed."""
    if kind.options is None:
        if not cfg.parallelism.options:
            return []
        return [
            Problem(
                "parallelism.options",
                f"parallelism={kind.name} takes no options (they are for parallelisms that declare them)",
                "drop parallelism.options",
            )
        ]
    try:
        kind.read_options(cfg)
    except ConfigError as e:
        return list(e.problems)
    return []


_KEYS: dict[type[Any], tuple[str, ...]] = {}  # a group's keys: every point of a sweep asks them


def group_keys(group: type[Any]) -> tuple[str, ...]:
    """settings_keys(group), computed once per group."""
    found = _KEYS.get(group)
    if found is None:
        found = _KEYS[group] = tuple(settings_keys(group))
    return found


def settings_keys(group: type[Any], prefix: str = "") -> list[str]:
    """The parallelism.* keys of a schema group, nested groups as dotted keys (shard.degree)."""
    keys: list[str] = []
    for f in dataclasses.fields(group):
        inner = f.default_factory if f.default_factory is not dataclasses.MISSING else None
        if isinstance(inner, type) and dataclasses.is_dataclass(inner):
            keys += settings_keys(inner, f"{prefix}{f.name}.")
        else:
            keys.append(prefix + f.name)
    return keys


def foreign_settings(cfg: Config, kind: type[ParallelismKind]) -> list[Problem]:
    """Settings only other parallelisms read, given to this one, would silently do nothing."""
    from hpctrain.config.schema import ParallelismConf

    owners: dict[str, list[str]] = {}  # key -> the parallelisms that read it
    labels: dict[str, str] = {}
    for name in parallelism_names():
        for group in parallelism_class(name).settings:
            for key in group_keys(group):
                owners.setdefault(key, []).append(name)
                labels[key] = str(getattr(group, "label", group.__name__))
    own = {k for group in kind.settings for k in group_keys(group)}
    defaults = ParallelismConf()
    return [
        Problem(
            f"parallelism.{key}",
            f"is a {labels[key]} setting; with parallelism={kind.name} it would do nothing",
            f"use parallelism={names[0]}"
            + (f" (or {', '.join(names[1:])})" if names[1:] else "")
            + f", or drop parallelism.{key}",
        )
        for key, names in owners.items()
        if key not in own and _plain(dotted(cfg.parallelism, key)) != _plain(dotted(defaults, key))
    ]


def _plain(v: object) -> object:
    """A list (or OmegaConf's ListConfig) as a list of strings; an enum as its string."""
    if isinstance(v, (bool, int, float, type(None))):
        return v
    if isinstance(v, str):
        return str(v)
    return [str(x) for x in v]  # type: ignore[attr-defined]


def _engine_problems(cfg: Config, kind: type[ParallelismKind]) -> list[Problem]:
    """The engine must have the capability the parallelism needs (engine/base.py)."""
    engine = str(cfg.parallelism.engine)
    if kind.needs is None or not lacks(engine, kind.needs):
        return []
    return [kind.engine_refusal(engine, engines_with(kind.needs))]


def batch_problems(cfg: Config) -> list[Problem]:
    """The batch against the layout's data-parallel replicas (the batch's own rules, one of the
    two set and at least 1, are the config's: config/validate.py)."""
    t, acc = cfg.train, cfg.parallelism.backward_passes_per_step
    world = world_size(cfg)
    if (t.batch_per_rank is None) == (t.global_batch is None) or world < 1 or acc < 1:
        return []
    if min(t.batch_per_rank or 1, t.global_batch or 1) < 1:
        return []
    n = layout_of(cfg).replicas
    if t.global_batch is not None and t.global_batch % n:
        lo, hi = (t.global_batch // n) * n, (t.global_batch // n + 1) * n
        what = "the world size" if n == world else "the number of replicas"
        return [
            Problem(
                "train.global_batch",
                f"{t.global_batch} is not divisible by {what} {n}",
                f"use a multiple of {n} (e.g. {lo or hi} or {hi}), or set train.batch_per_rank",
            )
        ]
    return _sample_problems(cfg)


def _sample_problems(cfg: Config) -> list[Problem]:
    b, acc = resolve_batch(cfg), cfg.parallelism.backward_passes_per_step
    if b.per_rank % acc:
        return [
            Problem(
                "parallelism.backward_passes_per_step",
                f"the per-rank batch {b.per_rank} is not divisible by {acc} backward passes",
                "choose backward_passes_per_step that divides the per-rank batch",
            )
        ]
    if (
        cfg.data._target_ is None
        and cfg.data.name in ("synthetic", "tokens")
        and b.global_ > cfg.data.num_samples
    ):
        return [
            Problem(
                "data.num_samples",
                f"{cfg.data.num_samples} samples cannot fill one global batch of {b.global_}",
                f"set data.num_samples >= {b.global_}, or use a smaller batch",
            )
        ]
    if cfg.data._target_ is None and cfg.data.name == "digits" and b.global_ > DIGITS_TRAIN:
        return [
            Problem(
                "train.batch_per_rank",
                f"the global batch {b.global_} exceeds the {DIGITS_TRAIN} training digits (360 more are held out)",
                f"use a global batch of at most {DIGITS_TRAIN}",
            )
        ]
    return []


def _checkpointing_problems(cfg: Config) -> list[Problem]:
    m = cfg.model
    if m.checkpoint_blocks and not m._target_:
        return [
            Problem(
                "model.checkpoint_blocks",
                f"built-in model {m.name} declares its own blocks",
                "drop model.checkpoint_blocks (it is for model._target_)",
            )
        ]
    if m.activation_checkpointing and not declared_checkpoint_blocks(m):
        return [
            Problem(
                "model.checkpoint_blocks",
                "activation checkpointing needs the blocks to recompute",
                "name them, e.g. model.checkpoint_blocks=[layer1,layer2]",
            )
        ]
    return []
