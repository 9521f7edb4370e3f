"""Rules checked against the model itself, built on the meta device (no memory, well under a
second): the names a config gives the model's modules (parallelism.shard.modules, a
tensor-parallel plan and its divided attributes, model.checkpoint_blocks) and what they require
of them (a tie kept in one FSDP unit, dimensions that split over the tensor-parallel degree).
Before, a name the model lacks failed every rank after the start. A user model is built with its
code on the path; one whose constructor cannot run on the meta device is checked where it is
built, on the ranks. Once per model and names: a sweep's points share them (2,000 resnet50
points built it 2,000 times, 21 s)."""

from __future__ import annotations

from typing import Any

from hpctrain.config.schema import Config
from hpctrain.config.tp_plan import is_style, plan_for
from hpctrain.errors import Problem

NAMES_FIX = "name modules as model.named_modules() does (wildcards: *)"


def model_problems(cfg: Config) -> list[Problem]:
    par, m = cfg.parallelism, cfg.model
    tp = par.tp
    wants_tp = (
        bool(tp.plan or tp.divide) and tp.degree >= 2 and all(is_style(str(v)) for v in tp.plan.values())
    )
    if not (par.shard.modules or wants_tp or (m._target_ and m.checkpoint_blocks)):
        return []
    key = (
        repr(m),
        repr(cfg.data),
        repr(cfg.code.dir),
        repr(par.shard.modules),
        repr(tp),
        repr(m.checkpoint_blocks),
    )
    if key not in _JUDGED:
        if len(_JUDGED) > 64:  # bounded: a sweep over model sizes
            _JUDGED.clear()
        _JUDGED[key] = _judge(cfg, wants_tp)
    return list(_JUDGED[key])


_JUDGED: dict[tuple[str, ...], list[Problem]] = {}


def _judge(cfg: Config, wants_tp: bool) -> list[Problem]:
    model = _meta_model(cfg)
    if model is None:
        return []
    p = _units(cfg, model) + _blocks(cfg, model)
    return p + (_tp_plan(cfg, model) if wants_tp else [])


def _meta_model(cfg: Config) -> Any:
    import torch

    from hpctrain.train.parts import make_model
    from hpctrain.train.targets import importable

    try:
        with importable(cfg.code.dir), torch.device("meta"):
            return make_model(cfg)
    except Exception:  # noqa: BLE001 - the user's constructor on the meta device: the ranks will tell
        return None


def _units(cfg: Config, model: Any) -> list[Problem]:
    """parallelism.shard.modules name modules or classes of the model, and keep each tie in one."""
    from hpctrain.engine.fsdp_wrap import ShardError, find_units
    from hpctrain.engine.ties import TieError, check_units

    modules = [str(u) for u in cfg.parallelism.shard.modules]
    if not modules:  # given to a parallelism that does not shard: refused there
        return []
    try:
        find_units(model, modules)
        check_units(model, modules)
    except ShardError as e:
        key, _, why = str(e).partition(": ")
        return [Problem(key, why, "name modules as model.named_modules() does, or classes of the model")]
    except TieError as e:
        key, _, why = str(e).partition(": ")
        return [Problem(key, why, "keep a tied parameter's modules in one unit")]
    return []


def _blocks(cfg: Config, model: Any) -> list[Problem]:
    """model.checkpoint_blocks name modules of a user's model (wildcards over repeated blocks)."""
    from hpctrain.train.modules import SplitError, resolve_blocks

    if not cfg.model._target_ or not cfg.model.checkpoint_blocks:
        return []
    try:
        resolve_blocks(model, [str(b) for b in cfg.model.checkpoint_blocks])
    except SplitError as e:
        key, _, why = str(e).partition(": ")
        return [Problem(key, why, NAMES_FIX + ", e.g. model.checkpoint_blocks=[transformer.h.*]")]
    return []


def _tp_plan(cfg: Config, model: Any) -> list[Problem]:
    """A plan that matches nothing, splits a module it cannot, a dimension that does not divide
    over the degree, a divide attribute that is not a count the degree divides, or a tied
    parameter split two ways."""
    from hpctrain.engine.tp_wrap import TensorParallelError, check_plan

    tp = cfg.parallelism.tp
    plan = plan_for(cfg.model, dict(tp.plan), tp.sequence_parallel)
    try:
        check_plan(model, plan, int(tp.degree), [str(a) for a in tp.divide])
    except TensorParallelError as e:
        key, _, why = str(e).partition(": ")
        fix = (
            "name each module (wildcards: *) and the whole-number attribute its forward reads, e.g. h.*.attn.n_head"
            if key == "parallelism.tp.divide"
            else "name Linear or Embedding modules as model.named_modules() does (wildcards: *)"
        )
        return [Problem(key, why, fix)]
    return []
