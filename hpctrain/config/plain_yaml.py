"""config.yaml's plain YAML of the dataclasses, both ways: to_yaml writes it when a run is
placed, and plain_config reads it back without OmegaConf, as every rank does at its start.

Merging the text onto the structured schema with OmegaConf took 70 ms of each rank's start
(2026-11-30, this 2-core machine); checking its values against the schema's annotations field by
field and building the dataclasses directly takes a few. Only text exactly as to_yaml writes it
is read this way: the Config built must give the same text again, and every value must already
have its field's type (an int for a float is widened, as OmegaConf does). Anything else (a
hand-edited file, an unknown key, a duplicated one, another type, an interpolation, ???) gives
None, and the caller reads it with OmegaConf, which names the problem. It also keeps as text
what YAML 1.1 (and so to_yaml) leaves a string but OmegaConf's loader takes for a float: a run
named `1e-3` reached the ranks as "0.001".
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from enum import Enum
from typing import Any

import yaml

from hpctrain.config.schema import CLUSTER_SCHEMAS, Config
from hpctrain.config.values import field_names

# libyaml's emitter and parser when PyYAML has them (its wheels do): the same YAML, ~10x faster
# per run of a 10,000-point sweep; the pure-Python ones otherwise
YAML_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


_SECTIONS: dict[str, str] = {}  # a section's YAML by its JSON: the points of a sweep share most


def to_yaml(cfg: Config) -> str:
    # Plain YAML of the dataclass: ~100x faster than OmegaConf.structured(cfg), and
    # plain_config (or OmegaConf, for other text) reads it back, so nothing is lost. Enum members
    # are written as their values. Each top-level section is emitted on its own (a block
    # mapping's entries concatenate) and kept, keyed by its JSON, which C encodes quickly.
    parts = []
    for key, value in _value(cfg).items():
        ident = repr((key, value))  # plain data in field order: its repr identifies it
        text = _SECTIONS.get(ident)
        if text is None:
            text = yaml.dump({key: value}, Dumper=YAML_DUMPER, sort_keys=False)
            if len(_SECTIONS) > 4096:
                _SECTIONS.clear()
            _SECTIONS[ident] = text
        parts.append(text)
    return "".join(parts)


def _value(v: Any) -> Any:
    if type(v) in (str, int, float, bool, type(None)):
        return v
    if isinstance(v, Enum):
        return v.value
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return {name: _value(getattr(v, name)) for name in field_names(type(v))}
    if isinstance(v, list | tuple):  # lists of enum members (study.engines), of lists
        return [_value(x) for x in v]
    if isinstance(v, dict):
        return {k: _value(x) for k, x in v.items()}
    return v


class _NotPlain(Exception):
    """A value to_yaml would not have written: the OmegaConf path reads the file instead."""


def plain_config(text: str) -> Config | None:
    """The Config that `text` holds where it is exactly what to_yaml writes (every value of its
    field's type, and to_yaml gives `text` back), or None where OmegaConf has to read it."""
    try:
        data = yaml.load(text, Loader=YAML_LOADER)
    except yaml.YAMLError:
        return None
    section = data.get("cluster") if type(data) is dict else None
    name = section.get("name") if type(section) is dict else None
    if type(name) is not str or name not in CLUSTER_SCHEMAS:
        return None
    try:
        cfg: Config = _build(Config, data, CLUSTER_SCHEMAS[name])
    except (_NotPlain, RecursionError):  # RecursionError: lists nested past Python's stack
        return None
    return cfg if to_yaml(cfg) == text else None  # nothing but what to_yaml writes


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    init = {f.name for f in dataclasses.fields(cls) if f.init}
    return {k: v for k, v in typing.get_type_hints(cls).items() if k in init}


def _build(cls: type, data: object, cluster: type | None = None) -> Any:
    if type(data) is not dict:
        raise _NotPlain
    hints = _hints(cls)
    if not data.keys() <= hints.keys():
        raise _NotPlain  # an unknown key
    kwargs = {k: _typed(cluster if k == "cluster" and cluster else hints[k], v) for k, v in data.items()}
    return cls(**kwargs)


def _typed(t: Any, v: object) -> Any:
    """`v` as a field annotated `t` holds it (widened int -> float); _NotPlain where OmegaConf
    would convert, interpolate or refuse it."""
    if t is Any:
        return _plain(v)
    origin, args = typing.get_origin(t), typing.get_args(t)
    if origin in (typing.Union, types.UnionType):  # Optional[X] and X | None
        if v is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        if len(inner) != 1:  # a union of types: OmegaConf decides
            raise _NotPlain
        return _typed(inner[0], v)
    if origin is list and type(v) is list:
        return [_typed(args[0], x) for x in v]
    if origin is dict and type(v) is dict and all(type(k) is str for k in v):
        return {k: _typed(args[1], x) for k, x in v.items()}
    if isinstance(t, type):
        if dataclasses.is_dataclass(t):
            return _build(t, v)
        if issubclass(t, Enum) and type(v) is str and v in t.__members__:
            return t[v]  # by name, as OmegaConf reads an enum (hpctrain's names are their values)
        if t is float and isinstance(v, int | float) and type(v) is not bool:
            return float(v)
        if t in (int, bool) and type(v) is t:
            return v
        if t is str:
            return _text(v)
    raise _NotPlain


def _plain(v: object) -> Any:
    """A value of an Any field (a target's keyword arguments): plain YAML data, copied."""
    if type(v) is str:
        return _text(v)
    if v is None or type(v) in (int, float, bool):
        return v
    if type(v) is list:
        return [_plain(x) for x in v]
    if type(v) is dict and all(type(k) is str for k in v):
        return {k: _plain(x) for k, x in v.items()}
    raise _NotPlain


def _text(v: object) -> str:
    # OmegaConf reads "${...}" as an interpolation and "???" as a missing value
    if type(v) is not str or "${" in v or v == "???":
        raise _NotPlain
    return v
