"""Configs for the points of a sweep or study, fast: the points share all but a few overrides.

Per distinct selection of config-group options, Hydra composes once, and the overrides every
point shares are applied once. A point that only sets plain `key=value` leaves on top (the usual
sweep: `train.seed=range(10000)`) is then a copy of that typed config with those leaves set, each
value converted and checked by OmegaConf once per distinct value (on a scratch copy). Anything
else (`+key`, `~key`, interpolations, keys a `_target_` folds into kwargs) takes the general path:
a copy of the composed config with Hydra's own override code. Both give what load_config gives
(tests/unit/test_config.py checks point by point)."""

from __future__ import annotations

import copy
import dataclasses
import functools
import os
import re
from collections.abc import Sequence
from enum import Enum
from typing import Any

from hydra.errors import HydraException
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from hpctrain.config.load import _translate, check_parsed, compose_config, normalise
from hpctrain.config.load import to_config as _to_config
from hpctrain.config.schema import Config
from hpctrain.config.search import search_path
from hpctrain.config.values import expand_user_paths


@functools.cache
def _parser() -> Any:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create()  # registers the grammar's functions: once, not per override


# `key=123` and `key=name`: what most sweep points vary, built without Hydra's grammar (0.5 ms a
# parse); anything else (floats, quotes, lists, functions, true/false/null/inf/nan) goes to it
SIMPLE = re.compile(
    r"^([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)=(-?[1-9][0-9]*|0|[A-Za-z_][A-Za-z0-9_]*)$"
)
KEYWORDS = {"true", "false", "null", "inf", "nan", "True", "False", "NULL", "Null", "NaN", "INF", "Inf"}


@functools.lru_cache(maxsize=65536)
def _parse_one(text: str) -> Any:
    """One override parsed (Hydra's grammar is slow: the shared ones are parsed once)."""
    m = SIMPLE.match(text)
    if m and m.group(2).lower() not in {k.lower() for k in KEYWORDS}:
        from hydra.core.override_parser.types import Override, OverrideType, ValueType

        raw = m.group(2)
        value: Any = int(raw) if raw[0].isdigit() or raw[0] == "-" else raw
        return Override(OverrideType.CHANGE, m.group(1), ValueType.ELEMENT, value, None, text)
    return _parser().parse_override(text)


def _apply(overrides: list[Any], cfg: DictConfig, where: Sequence[str]) -> None:
    from hydra._internal.config_loader_impl import ConfigLoaderImpl

    try:
        ConfigLoaderImpl._apply_overrides_to_config(overrides, cfg)
    except (HydraException, OmegaConfBaseException) as e:
        raise _translate(e, where) from e


class Base:
    """One selection of group options: the composed config with the shared overrides applied,
    its typed form, and a scratch copy that converts a leaf's value the way OmegaConf would."""

    def __init__(self, selection: tuple[str, ...], shared: list[Any], config_dir: Any, where: Sequence[str]):
        self.composed = compose_config(selection, config_dir)
        self.dict = copy.deepcopy(self.composed)
        _apply(shared, self.dict, where)
        self.typed = _to_config(copy.deepcopy(self.dict))
        self.scratch = copy.deepcopy(self.dict)
        self.values: dict[tuple[str, str], Any] = {}

    def value(self, o: Any, where: Sequence[str], current: Any) -> Any:
        """The leaf's value as OmegaConf converts and checks it; an int for an int field, or
        text for a text field, as it is (what a seed or name sweep sets)."""
        v = o.value()
        if type(v) is type(current) and type(v) in (int, str):
            return v
        key = (o.key_or_group, o.input_line)
        if key not in self.values:
            _apply([o], self.scratch, where)
            v = OmegaConf.select(self.scratch, o.key_or_group)
            self.values[key] = OmegaConf.to_object(v) if isinstance(v, DictConfig | ListConfig) else v
        return copy.deepcopy(self.values[key])

    def point(self, leaves: list[Any], where: Sequence[str]) -> Config | None:
        """The typed config with these leaves set, or None if one is not a plain dataclass field.
        Only the sections it changes are copied (and `code`, which finishing may set); the others
        are shared with the base: a loaded config is never changed in place afterwards."""
        cfg = copy.copy(self.typed)
        for section in {o.key_or_group.split(".")[0] for o in leaves} | {"code"}:
            if not hasattr(cfg, section):
                return None
            setattr(cfg, section, clone(getattr(cfg, section)))
        for o in leaves:
            *parents, name = o.key_or_group.split(".")
            node: Any = cfg
            for p in parents:
                node = getattr(node, p, None)
            if not dataclasses.is_dataclass(node) or name not in {f.name for f in dataclasses.fields(node)}:
                return None
            setattr(node, name, self.value(o, where, getattr(node, name)))
        expand_user_paths(cfg)
        if cfg.user_code and cfg.code.dir is None:
            cfg.code.dir = os.getcwd()
        return cfg


IMMUTABLE = (str, int, float, bool, type(None))


def clone(v: Any) -> Any:
    """A deep copy of a config (dataclasses of scalars, enums, lists and dicts), ~5x faster than
    copy.deepcopy, which goes through __reduce_ex__ for every dataclass."""
    t = type(v)
    if t in IMMUTABLE or isinstance(v, Enum):
        return v
    if t is list:
        return [clone(x) for x in v]
    if t is dict:
        return {k: clone(x) for k, x in v.items()}
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        out = object.__new__(t)
        out.__dict__.update({k: clone(x) for k, x in v.__dict__.items()})
        return out
    return copy.deepcopy(v)


def _plain_leaf(o: Any) -> bool:
    from hydra.core.override_parser.types import OverrideType

    text = o.input_line or ""
    return o.type == OverrideType.CHANGE and o.package is None and "${" not in text


def _disjoint(keys: list[str]) -> bool:
    """No key repeats or lies under another: the overrides then commute."""
    ordered = sorted(keys)
    return all(not (b == a or b.startswith(a + ".")) for a, b in zip(ordered, ordered[1:]))


def load_configs(
    points: Sequence[Sequence[str]], config_dir: str | os.PathLike[str] | None = None
) -> list[Config]:
    """Configs for many override lists (a sweep or study), in order; the same as load_config of
    each, and the same errors."""
    found = search_path(config_dir)
    groups = found.groups()
    parsed_points = []
    for overrides in map(normalise, points):
        try:
            parsed = [_parse_one(o) for o in overrides]
        except HydraException as e:
            raise _translate(e, overrides) from e
        check_parsed(parsed, found, groups)
        parsed_points.append((overrides, parsed))
    shared_lines = set.intersection(*(set(ov) for ov, _ in parsed_points)) if parsed_points else set()
    bases: dict[tuple[str, ...], Base] = {}
    out = []
    for overrides, parsed in parsed_points:
        is_group = [o.key_or_group in groups or o.package is not None for o in parsed]
        selection = tuple(o.input_line for o, g in zip(parsed, is_group) if g and o.input_line)
        rest = [o for o, g in zip(parsed, is_group) if not g]
        shared = [o for o in rest if o.input_line in shared_lines]
        own = [o for o in rest if o.input_line not in shared_lines]
        if selection not in bases:
            bases[selection] = Base(selection, shared, config_dir, overrides)
        base = bases[selection]
        disjoint = _disjoint([o.key_or_group for o in rest])
        cfg = base.point(own, overrides) if disjoint and all(_plain_leaf(o) for o in own) else None
        if cfg is None:  # the general path: Hydra's override code on a copy
            dict_cfg = copy.deepcopy(base.dict if disjoint else base.composed)
            _apply(own if disjoint else rest, dict_cfg, overrides)
            cfg = _to_config(dict_cfg)
        out.append(cfg)
    return out
