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
from hpctrain.errors import Problem
from hpctrain.parallel.dimensions import checks_model
from hpctrain.parallel.dimensions import model_problems as dimension_problems

NAMES_FIX = "name modules as model.named_modules() does (wildcards: *)"


def model_problems(cfg: Config) -> list[Problem]:
    par, m = cfg.parallelism, cfg.model
    tp = par.tp
    named = checks_model(cfg)  # the dimensions' settings that name the model's modules
    if not (par.shard.modules or named or (m._target_ and m.checkpoint_blocks)):
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
        _JUDGED[key] = _judge(cfg, named)
    return list(_JUDGED[key])


_JUDGED: dict[tuple[str, ...], list[Problem]] = {}


def _judge(cfg: Config, named: bool) -> list[Problem]:
    model = _meta_model(cfg)
    if model is None:
        return []
    p = _units(cfg, model) + _blocks(cfg, model)
    return p + (dimension_problems(cfg, model) if named else [])


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
