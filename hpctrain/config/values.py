"""Rules for every value of a config, whatever its key: these hold for the whole class of
settings, including options added later, so no new field can slip past them.

- No string holds a control character (line break, carriage return, tab, NUL, escape, ...): a
  value may reach an sbatch script, an mpirun argument list or a log line, where a line break
  starts a new command.
- Every string is valid UTF-8 (a command-line byte that is not arrives as a lone surrogate,
  which no file or script can hold).
- No float is infinite or NaN: it would train silently into garbage.
- A path that becomes a SLURM output pattern holds no '%' (sbatch expands %j, %t, ...).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import os
import re
from collections.abc import Iterator
from enum import Enum
from typing import Any

from hpctrain.errors import Problem

CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# paths that sbatch's --output/--error and submitit's folder are built from
SLURM_PATTERN_PATHS = ("run.dir", "run.output_root", "cluster.submitit_folder")
# every path option: a leading ~ or ~user is expanded once, when the config is loaded
PATH_FIELDS = (
    "run.dir",
    "run.output_root",
    "cluster.submitit_folder",
    "cluster.container.image",
    "cluster.container.storage",
    "data.path",
    "code.dir",
    "script.path",
)
# user code is found from where hpctrain was started: made absolute when the config is loaded
ABSOLUTE_FIELDS = ("code.dir", "script.path")


_RAISE = object()


def dotted(obj: Any, key: str, missing: Any = _RAISE) -> Any:
    """obj.a.b for key "a.b": AttributeError where a name is missing, or `missing` if given."""
    for name in key.split("."):
        obj = getattr(obj, name) if missing is _RAISE else getattr(obj, name, missing)
    return obj


def _set(cfg: Any, key: str, value: Any) -> None:
    *parents, name = key.split(".")
    node = cfg
    for p in parents:
        node = getattr(node, p)
    setattr(node, name, value)


def expand_user_paths(cfg: Any) -> None:
    """~ and ~user at the start of a path option mean a home directory, as in a shell (Hydra
    overrides are not expanded by the shell: `run.dir=~/x` arrives as typed)."""
    for key in PATH_FIELDS:
        value = dotted(cfg, key, None)
        if isinstance(value, str) and value.startswith("~") and _utf8(value):
            _set(cfg, key, os.path.expanduser(value))
    for key in ABSOLUTE_FIELDS:
        value = dotted(cfg, key, None)
        if isinstance(value, str) and value and not value.startswith("~") and _utf8(value):
            _set(cfg, key, os.path.abspath(value))


SKIPPED = (int, bool, type(None))  # leaves no value rule applies to (enums are skipped too)


@functools.cache
def field_names(cls: type) -> tuple[str, ...]:
    """A dataclass's field names in order, looked up once a class (configs are walked often)."""
    return tuple(f.name for f in dataclasses.fields(cls))


def leaves(node: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(key, value) of every text and number leaf of a config, where the value rules apply: a.b
    for fields and dict keys, a[i] for lists. Leaves of other types are passed over without a
    key being built (validation runs for each of 10,000 sweep points)."""
    fields = (
        field_names(type(node)) if dataclasses.is_dataclass(node) and not isinstance(node, type) else None
    )
    if fields is not None:
        d = node.__dict__
        for name in fields:
            v = d[name]
            if type(v) not in SKIPPED and not isinstance(v, Enum):
                yield from leaves(v, f"{prefix}{name}.")
    elif isinstance(node, dict):
        for k, v in node.items():
            if isinstance(k, str) and CONTROL.search(k):
                yield f"{prefix}{k!r}", k  # a dict key is a value too (cluster.env names)
            yield from leaves(v, f"{prefix}{k}.")
    elif isinstance(node, list | tuple):
        for i, v in enumerate(node):
            yield from leaves(v, f"{prefix.rstrip('.')}[{i}].")
    else:
        yield prefix.rstrip("."), node


_MEMO: dict[int, tuple[Any, list[Problem]]] | None = None  # per section object, while enabled


@contextlib.contextmanager
def sections_shared() -> Iterator[None]:
    """While validating the points of a sweep: a section object shared by many points (see
    config/points.py) has its value problems found once."""
    global _MEMO
    outer, _MEMO = _MEMO, {}
    try:
        yield
    finally:
        _MEMO = outer


def _leaf_problems(cfg: Any) -> list[Problem]:
    if _MEMO is None or not dataclasses.is_dataclass(cfg) or isinstance(cfg, type):
        return _value_rules(leaves(cfg))
    out: list[Problem] = []
    for name in field_names(type(cfg)):
        section = getattr(cfg, name)
        hit = _MEMO.get(id(section))
        if hit is None or hit[0] is not section:  # the object itself is kept: its id stays its own
            hit = (section, _value_rules(leaves(section, f"{name}.")))
            _MEMO[id(section)] = hit
        out += hit[1]
    return out


def value_problems(cfg: Any) -> list[Problem]:
    p = _leaf_problems(cfg)
    return p + _path_problems(cfg)


def _value_rules(found: Iterator[tuple[str, Any]]) -> list[Problem]:
    p: list[Problem] = []
    for key, value in found:
        if isinstance(value, Enum):
            continue
        if isinstance(value, str) and not _utf8(value):
            p.append(
                Problem(
                    key,
                    f"{value!r} is not valid UTF-8 text (bytes the terminal or file could not decode)",
                    f"give {key} in UTF-8",
                )
            )
        elif isinstance(value, str) and CONTROL.search(value):
            char = CONTROL.search(value).group()  # type: ignore[union-attr]
            p.append(
                Problem(
                    key,
                    f"holds the control character {char!r}: a line break or similar would start a "
                    "new line in the sbatch script or command it reaches",
                    f"give {key} as one line of printable text",
                )
            )
        elif isinstance(value, float) and not math.isfinite(value):
            p.append(Problem(key, f"must be a finite number (got {value})", f"set {key} to a finite value"))
    return p


def _path_problems(cfg: Any) -> list[Problem]:
    p: list[Problem] = []
    for key in PATH_FIELDS:
        value = dotted(cfg, key, None)
        if isinstance(value, str) and value.startswith("~"):  # expand_user_paths left it: no such user
            p.append(Problem(key, f"{value!r} names the home of an unknown user", f"give {key} in full"))
    if getattr(cfg.cluster, "name", "") == "slurm":
        for key in SLURM_PATTERN_PATHS:
            value = dotted(cfg, key, None)
            if isinstance(value, str) and "%" in value:
                p.append(
                    Problem(
                        key,
                        f"{value!r} holds '%': SLURM expands %j, %t, ... in the log file names built from it",
                        f"choose a path without '%' for {key}",
                    )
                )
    return p


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def structured_options(cls: type[Any], given: Any, key: str, whose: str) -> Any:
    """`given` (a mapping of free-form options, as parallelism.options) read as the dataclass
    `cls` of the code that takes them; ConfigError naming `key.<option>` for an option it does not
    have or a value of the wrong type."""
    from omegaconf import DictConfig, OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from hpctrain.errors import ConfigError

    raw = OmegaConf.to_container(given) if isinstance(given, DictConfig) else given
    plain: dict[str, Any] = {str(k): v for k, v in dict(raw).items()} if isinstance(raw, dict) else {}
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = [
        Problem(f"{key}.{k}", f"is not an option of {whose}", f"use one of: {', '.join(names)}")
        for k in plain
        if k not in names
    ]
    if unknown:
        raise ConfigError(unknown)
    try:
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(cls), plain))
    except OmegaConfBaseException as e:
        where = f"{key}.{e.key}" if getattr(e, "key", None) else key
        types = ", ".join(f"{f.name}: {getattr(f.type, '__name__', f.type)}" for f in dataclasses.fields(cls))
        raise ConfigError.one(
            where, str(e.msg).splitlines()[0], f"the options of {whose} are {types}"
        ) from None
