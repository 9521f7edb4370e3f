"""Compose a Config from conf/ and command-line overrides with Hydra's compose API.

Hydra's own errors (unknown key, wrong type, unknown group option, bad override syntax) are turned
into ConfigError naming the key and listing what is valid, before anything runs.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import typing
from collections.abc import Sequence
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import (
    ConfigAttributeError,
    ConfigKeyError,
    MissingMandatoryValue,
    OmegaConfBaseException,
    ValidationError,
)

from hpctrain.config.hydra_state import store_shared, version_base_kept
from hpctrain.config.overrides import normalise
from hpctrain.config.plain_yaml import plain_config
from hpctrain.config.schema import CLUSTER_SCHEMAS, Config, register
from hpctrain.config.search import SearchPath, search_path
from hpctrain.config.values import expand_user_paths
from hpctrain.errors import ConfigError, Problem

TARGETED = ("model", "data", "loss", "optim")  # sections whose _target_ takes keyword arguments as extra keys


def compose_config(
    overrides: Sequence[str], config_dir: str | os.PathLike[str] | None = None, config_name: str = "config"
) -> DictConfig:
    register()
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException

    GlobalHydra.instance().clear()
    found = search_path(config_dir)
    overrides = normalise(overrides)
    _check_group_choices(overrides, found)
    with (
        version_base_kept(),
        store_shared(),
        initialize_config_dir(config_dir=str(found.shipped), version_base="1.3", job_name="hpctrain"),
    ):
        try:
            return compose(config_name=config_name, overrides=[*overrides, *found.hydra_overrides()])
        except (HydraException, OmegaConfBaseException) as e:
            raise _translate(e, overrides) from e
        except AssertionError as e:  # OmegaConf.update of a key under a null section
            if "Unexpected type for root" not in str(e):
                raise
            raise _unselected(overrides, found.groups()) from e
        except yaml.YAMLError as e:  # a broken YAML file in the config directory
            raise ConfigError.one(
                "--config-dir", f"a YAML file does not parse: {' '.join(str(e).split())}", "fix that file"
            ) from e


def _unselected(overrides: Sequence[str], groups: set[str]) -> ConfigError:
    """A key of a section that this command leaves empty (`study.ranks=[1]` on `hpctrain run`)."""
    chosen = {o.split("=", 1)[0].lstrip("+~") for o in overrides if "=" in o}
    keys = [k for k in chosen if "." in k and k.split(".")[0] in groups and k.split(".")[0] not in chosen]
    key = sorted(keys)[0] if keys else "?"
    section = key.split(".")[0]
    fix = (
        "run a study with hpctrain study strong|weak"
        if section == "study"
        else f"select the section first ({section}=...), or drop {key}"
    )
    return ConfigError.one(key, f"{section} is not selected in this command, so {key} sets nothing", fix)


def _check_group_choices(overrides: Sequence[str], found: SearchPath) -> None:
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except HydraException as e:
        raise _translate(e, overrides) from e
    check_parsed(parsed, found)


def check_parsed(parsed: Sequence[Any], found: SearchPath, groups: set[str] | None = None) -> None:
    """What Hydra would accept but hpctrain would ignore or fail on later: `=5` (no key), `model=5`
    (Hydra raises a bare ValueError), `model=[mlp,cnn]` (Hydra merges both options into one
    config), a sweep (`model=cnn,mlp`, `train.steps=range(1,3)`) without -m, and `hydra.*`
    (hpctrain composes with Hydra's compose API, which applies none of Hydra's own run, sweep,
    launcher or job settings)."""
    groups = found.groups() if groups is None else groups
    problems = []
    for o in parsed:
        key, value = o.key_or_group, o.value()
        if not key:
            problems.append(Problem(o.input_line, "has no key", "write key=value, e.g. train.steps=5"))
        elif key == "hydra" or key.startswith(("hydra.", "hydra/")):
            problems.append(
                Problem(
                    key,
                    "Hydra's own settings are not applied (hpctrain composes the config itself)",
                    "drop it: run.dir / run.output_root place the records, -m sweeps, cluster=slurm submits",
                )
            )
        elif o.is_sweep_override():  # points arrive expanded: a sweep here lacks its -m
            problems.append(
                Problem(
                    key,
                    f"{o.input_line} gives several values, and only a multirun sweeps them",
                    f"sweep them with -m ({o.input_line}), or give one value",
                )
            )
        elif key in groups and o.package is None and isinstance(value, list):
            problems.append(
                Problem(
                    key,
                    f"a list would merge the options {value} into one config",
                    f"to run each, sweep them: -m {key}={','.join(map(str, value))}",
                )
            )
        elif key in groups and o.package is None and not isinstance(value, str):
            options = found.options(key)
            problems.append(
                Problem(
                    key,
                    f"names no option of the config group (got {value!r})",
                    f"choose one of: {', '.join(options)}",
                )
            )
    if problems:
        raise ConfigError(problems)


def load_config(overrides: Sequence[str] = (), config_dir: str | os.PathLike[str] | None = None) -> Config:
    """The typed Config for these overrides. Raises ConfigError; does no validation beyond types."""
    return to_config(compose_config(overrides, config_dir))


def unknown_keys(node: DictConfig, prefix: str = "") -> list[Problem]:
    """Keys a `+key=value` override forced into a typed node (OmegaConf would drop them silently)."""
    out: list[Problem] = []
    schema = OmegaConf.get_type(node)
    names = {f.name for f in dataclasses.fields(schema)} if dataclasses.is_dataclass(schema) else None
    for key in node.keys():
        full = f"{prefix}{key!s}"
        if names is not None and key not in names:
            out.append(Problem(full, "unknown key", _did_you_mean(full) or _valid_keys(schema)))  # type: ignore[arg-type]
            continue
        child = node._get_node(key)
        if isinstance(child, DictConfig) and not child._is_missing() and not child._is_none():
            out.extend(unknown_keys(child, full + "."))
    return out


def fold_target_kwargs(cfg: DictConfig) -> None:
    """`model._target_=pkg.Net +model.hidden=64`: with a _target_, a section's keys beyond its
    schema are the target's keyword arguments (Hydra's convention); they move into `kwargs`."""
    for section in TARGETED:
        node = cfg.get(section)
        if not isinstance(node, DictConfig) or node.get("_target_") is None:
            continue
        schema = OmegaConf.get_type(node)
        if not dataclasses.is_dataclass(schema):
            continue
        names = {f.name for f in dataclasses.fields(schema)}
        with open_dict(node):
            for key in [k for k in node.keys() if k not in names]:
                node.kwargs[key] = node[key]
                del node[key]


def to_config(cfg: DictConfig) -> Config:
    fold_target_kwargs(cfg)
    extra = unknown_keys(cfg)
    if extra:
        raise ConfigError(extra)
    try:
        obj = OmegaConf.to_object(cfg)
    except MissingMandatoryValue as e:
        key = e.full_key or "?"
        raise ConfigError.one(
            key, "is required and has no value (???)", f"set it on the command line: {key}=VALUE"
        ) from e
    except OmegaConfBaseException as e:
        raise _translate(e) from e
    if not isinstance(obj, Config):
        raise ConfigError.one(
            "<root>",
            "the config does not extend hpctrain's schema",
            "start the defaults list of config.yaml with hpctrain_schema",
        )
    expand_user_paths(obj)
    if obj.user_code and obj.code.dir is None:
        obj.code.dir = os.getcwd()  # "the current directory", fixed now so every rank agrees
    return obj


@functools.cache
def schema_node(cluster: str) -> DictConfig:
    """The typed schema with the named cluster's section, as OmegaConf nodes: made once a process
    (half of a config.yaml's read, 0.05 CPU-s) and never changed, since merge() copies it."""
    base = OmegaConf.structured(Config)
    base.cluster = OmegaConf.structured(CLUSTER_SCHEMAS[cluster])
    return base


def config_from_yaml(text: str) -> Config:
    """The Config a run directory's config.yaml holds (written by to_yaml). Without Hydra: a
    rank only merges the YAML into the schema; text exactly as to_yaml writes it is read without
    OmegaConf (plain_yaml.py: ~70 ms of a rank's start)."""
    cfg = plain_config(text)
    return cfg if cfg is not None else omegaconf_read(text)


def omegaconf_read(text: str) -> Config:
    """config.yaml merged onto the structured schema by OmegaConf: any YAML, its errors named."""
    data = OmegaConf.create(text)
    if not isinstance(data, DictConfig):
        raise ConfigError.one("<config.yaml>", "is not a mapping", "write it with hpctrain (to_yaml)")
    section = data.get("cluster")
    cluster = str(section.get("name", "")) if isinstance(section, DictConfig) else ""
    if cluster not in CLUSTER_SCHEMAS:
        raise ConfigError.one(
            "cluster.name", f"unknown cluster {cluster!r}", f"use one of {sorted(CLUSTER_SCHEMAS)}"
        )
    try:
        return to_config(OmegaConf.merge(schema_node(cluster), data))  # type: ignore[arg-type]
    except OmegaConfBaseException as e:
        raise _translate(e) from e


def _did_you_mean(key: str) -> str:
    """`engine=ddp` for `parallelism.engine=ddp`: the keys of the schema that end as this one does."""
    tail = key.rsplit(".", 1)[-1]
    paths = _paths(Config) + [p for c in CLUSTER_SCHEMAS.values() for p in _paths(c, "cluster.")]
    found = [p for p in dict.fromkeys(paths) if p != key and p.rsplit(".", 1)[-1] == tail]
    return f"did you mean {' or '.join(f'{p}=...' for p in found[:3])}?" if found else ""


def _paths(schema: type, prefix: str = "") -> list[str]:
    """Every dotted key of a schema dataclass, nested sections included."""
    hints = typing.get_type_hints(schema)
    out = []
    for f in dataclasses.fields(schema):
        out.append(prefix + f.name)
        t = hints.get(f.name)
        t = next((a for a in typing.get_args(t) if a is not type(None)), t)  # Optional[X] -> X
        if isinstance(t, type) and dataclasses.is_dataclass(t):
            out += _paths(t, f"{prefix}{f.name}.")
    return out


def _valid_keys(schema: type | None) -> str:
    if schema is None or not dataclasses.is_dataclass(schema):
        return ""
    fields = [f"{f.name} (default: {_default(f)})" for f in dataclasses.fields(schema)]
    return "valid keys are: " + ", ".join(fields)


def _default(f: dataclasses.Field) -> object:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        value = f.default_factory()  # type: ignore[misc]
        return "{...}" if dataclasses.is_dataclass(value) else value
    return "required"


def _translate(e: BaseException, overrides: Sequence[str] = ()) -> ConfigError:
    """The most specific OmegaConf error in e's cause chain, as a ConfigError."""
    chain: list[BaseException] = []
    cur: BaseException | None = e
    while cur is not None and cur not in chain:
        chain.append(cur)
        cur = cur.__cause__ or cur.__context__
    top = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    for err in reversed(chain):
        if not isinstance(err, OmegaConfBaseException) or not getattr(err, "full_key", None):
            continue
        key = getattr(err, "full_key", None) or "?"
        msg = (getattr(err, "msg", None) or str(err)).splitlines()[0]
        if isinstance(err, (ConfigKeyError, ConfigAttributeError)):
            hint = " ".join(str(e).splitlines()[1:]).strip()  # Hydra's "To append ... use +key=v"
            return ConfigError(
                [
                    Problem(
                        key,
                        f"unknown key ({msg})",
                        _did_you_mean(key)
                        or _valid_keys(getattr(err, "object_type", None))
                        or hint
                        or "remove it, or check its spelling",
                    )
                ]
            )
        options = re.match(r"Invalid value '(.*)', expected one of \[(.*)\]", msg)
        if isinstance(err, ValidationError) and options:
            first = options.group(2).split(",")[0].strip()
            return ConfigError(
                [
                    Problem(
                        key,
                        f"{options.group(1)!r} is not one of {options.group(2)}",
                        f"set {key}={first} (or another of the listed values)",
                    )
                ]
            )
        if isinstance(err, ValidationError):
            return ConfigError(
                [Problem(key, f"wrong type: {msg}", f"give {key} a value of the type its schema declares")]
            )
        if isinstance(err, MissingMandatoryValue):
            return ConfigError(
                [
                    Problem(
                        key, "is required and has no value (???)", f"set it on the command line: {key}=VALUE"
                    )
                ]
            )
    msg = str(e).strip()
    missing = re.search(r"Could not find '([^/']+)/([^']+)'", msg)
    if missing:
        group, option = missing.groups()
        options = re.search(r"Available options in '[^']+':\n((?:\t.*\n?)+)", msg)
        listed = ", ".join(o.strip() for o in options.group(1).splitlines()) if options else "?"
        return ConfigError(
            [Problem(group, f"unknown option {option!r} for group {group}", f"use one of: {listed}")]
        )
    bad = [o for o in overrides if o and o in msg]
    key = bad[0].split("=", 1)[0].lstrip("+~") if bad else "<overrides>"
    return ConfigError(
        [
            Problem(
                key,
                f"cannot parse the override: {top}",
                "use Hydra's syntax key=value (quote values with special characters: "
                "key='a;b c'), group=option, +new_key=value",
            )
        ]
    )
