"""Context parallelism's plan-time rules: each problem names the key, the rule and the fix."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hpctrain.errors import Problem
from hpctrain.parallel.context.settings import cp_settings

if TYPE_CHECKING:
    from hpctrain.config.schema import Config

BUILTIN_SPLIT = {"transformer": "blocks.layers.0"}  # the built-in models with a sequence: their first block


def split_at(cfg: Config) -> str:
    """Where the sequence is split: the setting, else the built-in model's first block ("": none)."""
    given = cp_settings(cfg).split_at
    return given or ("" if cfg.model._target_ else BUILTIN_SPLIT.get(str(cfg.model.name), ""))


def context_problems(cfg: Config, world: int) -> list[Problem]:
    n = cp_settings(cfg).degree
    if n < 1:
        return [Problem("parallelism.cp.degree", f"must be >= 1 (got {n})", "e.g. parallelism.cp.degree=2")]
    if cfg.script.path:
        return [
            Problem(
                "parallelism.cp.degree",
                "context parallelism splits the sequence inside hpctrain's trainer; a script runs its own training",
                "drop parallelism.cp.degree, or give your model as model._target_",
            )
        ]
    return _world(cfg, world, n) + _model(cfg, n)


def _world(cfg: Config, world: int, n: int) -> list[Problem]:
    par = cfg.parallelism
    other = max(par.tp.degree, 1) * max(par.stages, 1)
    if world < 1 or world % (n * other) == 0:
        return []
    return [
        Problem(
            "parallelism.cp.degree",
            f"the world is stages x data-parallel ranks x cp degree x tp degree: {world} ranks are not a "
            f"multiple of {n * other} (cp {n} x tp {par.tp.degree} x stages {par.stages})",
            f"use a world that is a multiple of {n * other}, or a cp degree dividing {world // other or 1}",
        )
    ]


def _model(cfg: Config, n: int) -> list[Problem]:
    m, s = cfg.model, cp_settings(cfg)
    if m._target_ and not s.split_at:
        return [
            Problem(
                "parallelism.cp.split_at",
                "your model's sequence is split at the input of one of its modules, which is not named",
                "name the module whose input is (batch, sequence, ...) and after which attention calls "
                "F.scaled_dot_product_attention, e.g. parallelism.cp.split_at=transformer.h.0",
            )
        ]
    if not m._target_ and str(m.name) not in BUILTIN_SPLIT:
        return [
            Problem(
                "parallelism.cp.degree",
                f"model {m.name} has no sequence to split",
                "use model=transformer, or your model (model._target_) with parallelism.cp.split_at",
            )
        ]
    p = []
    if cfg.data.seq_len % (2 * n):
        p.append(
            Problem(
                "data.seq_len",
                f"{cfg.data.seq_len} tokens do not cut into {2 * n} equal chunks (each of {n} ranks holds "
                "two: the zig-zag that balances causal attention)",
                f"use a multiple of {2 * n}",
            )
        )
    if cfg.parallelism.tp.sequence_parallel:
        p.append(
            Problem(
                "parallelism.tp.sequence_parallel",
                "splits the sequence over the tensor-parallel ranks, which context parallelism already splits",
                "drop parallelism.tp.sequence_parallel (tensor parallelism itself composes)",
            )
        )
    return p
