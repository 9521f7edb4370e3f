"""The configuration reference: every key of the typed schema (config/schema.py and the cluster
schemas) with its type, default, choices and meaning, and every option of every config group in
conf/ with what it sets. Pure: classes and files in, Markdown out."""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from hpctrain.config.cluster import ClusterConf
from hpctrain.config.schema import CLUSTER_SCHEMAS, Config
from hpctrain.docgen.comments import field_meanings, summary


@dataclass(frozen=True)
class Key:
    """One leaf key of the configuration."""

    path: str  # e.g. parallelism.shard.degree
    type: str
    default: str
    choices: str
    meaning: str


def _unwrap(tp: Any) -> tuple[Any, bool]:
    """The type inside Optional[...], and whether it was optional."""
    args = typing.get_args(tp)
    if typing.get_origin(tp) in (typing.Union, types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return (rest[0] if len(rest) == 1 else Any), True
    return tp, False


def type_name(tp: Any) -> str:
    inner, optional = _unwrap(tp)
    origin = typing.get_origin(inner)
    if origin in (list, typing.List):  # noqa: UP006 - the schema's own spelling
        (item,) = typing.get_args(inner) or (Any,)
        text = f"list of {type_name(item)}"
    elif origin in (dict, typing.Dict):  # noqa: UP006
        text = "map"
    elif isinstance(inner, type) and issubclass(inner, enum.Enum):
        text = "choice"
    elif isinstance(inner, type):
        text = inner.__name__
    else:
        text = "any"
    return f"{text} or null" if optional else text


def choices(tp: Any) -> str:
    inner, _ = _unwrap(tp)
    if isinstance(inner, type) and issubclass(inner, enum.Enum):
        return " \\| ".join(f"`{m.value}`" for m in inner)
    return ""


def value_text(v: Any) -> str:
    """A value as one would write it in an override."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, enum.Enum):
        return str(v.value)
    if isinstance(v, list):
        return "[" + ", ".join(value_text(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {value_text(x)}" for k, x in v.items()) + "}"
    return str(v)


def _default(f: dataclasses.Field[Any]) -> str:
    if f.default is not dataclasses.MISSING:
        return "required" if f.default == "???" else f"`{value_text(f.default)}`"
    factory = f.default_factory
    if factory is dataclasses.MISSING:
        return ""
    if factory in (list, dict) or getattr(factory, "__name__", "") == "<lambda>":
        return f"`{value_text(factory())}`"
    # computed where it runs (e.g. the engine: Horovod where it is installed): say so, not this
    # machine's answer, or the reference would differ from machine to machine
    return f"computed: {summary(factory).rstrip('.')}"


def _is_section(tp: Any) -> type | None:
    inner, _ = _unwrap(tp)
    return inner if isinstance(inner, type) and dataclasses.is_dataclass(inner) else None


def keys(cls: type, prefix: str, skip: frozenset[str] = frozenset()) -> Iterator[Key]:
    """Every leaf key under `prefix` (a section's nested dataclasses included), in schema order."""
    if not dataclasses.is_dataclass(cls):
        return
    hints = typing.get_type_hints(cls)
    meanings = field_meanings(cls)
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        path = f"{prefix}{f.name}"
        section = _is_section(hints[f.name])
        if section is not None:
            yield from keys(section, path + ".")
            continue
        tp = hints[f.name]
        yield Key(path, type_name(tp), _default(f), choices(tp), meanings.get(f.name, ""))


def cluster_keys() -> dict[str, list[Key]]:
    """The cluster group's keys: those every launcher reads, then each launcher's own."""
    common = {f.name for f in dataclasses.fields(ClusterConf)}
    out = {"every launcher": list(keys(ClusterConf, "cluster."))}
    for name, schema in CLUSTER_SCHEMAS.items():
        out[f"cluster={name}"] = list(keys(schema, "cluster.", frozenset(common)))
    return out


def all_keys() -> list[Key]:
    """Every key a config can set (the cluster's for every launcher)."""
    out: list[Key] = []
    for f in dataclasses.fields(Config):
        if f.name == "cluster":
            for ks in cluster_keys().values():
                out.extend(ks)
        else:
            section = _is_section(typing.get_type_hints(Config)[f.name])
            out.extend(keys(section, f.name + ".") if section else [])
    return out


@dataclass(frozen=True)
class Option:
    """One option of a config group: conf/<group>/<name>.yaml."""

    group: str
    name: str
    about: str
    sets: str


def flat(body: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """A YAML mapping's leaves as dotted keys (`shard: {degree: 2}` is shard.degree)."""
    for k, v in body.items():
        if isinstance(v, dict) and v:
            yield from flat(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}", v


def _header(text: str) -> str:
    """A YAML file's leading comment, on one line."""
    lines = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("#").strip())
    return " ".join(lines)


def options(conf: Path) -> list[Option]:
    out = []
    for group in sorted(p for p in conf.iterdir() if p.is_dir() and not p.name.startswith("_")):
        for f in sorted(group.glob("*.yaml")):
            text = f.read_text()
            body = yaml.safe_load(text) or {}
            sets = ", ".join(f"`{k}={value_text(v)}`" for k, v in flat(body) if k not in ("defaults", "name"))
            out.append(Option(group.name, f.stem, _header(text), sets))
    return out


def defaults(conf: Path) -> dict[str, str]:
    """The default option of each group (config.yaml's defaults list)."""
    doc = yaml.safe_load((conf / "config.yaml").read_text())
    return {k: value_text(v) for d in doc["defaults"] if isinstance(d, dict) for k, v in d.items()}


def cell(text: str) -> str:
    """Text for a Markdown table cell: `|` escaped, and outside code spans `<` too (MyST would
    read `<run dir>` as HTML)."""
    parts = text.replace("|", "\\|").replace("\n", " ").split("`")
    return "`".join(p if i % 2 else p.replace("<", "&lt;") for i, p in enumerate(parts))


def _key_table(ks: list[Key]) -> list[str]:
    rows = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for k in ks:
        meaning = cell(k.meaning) + (f" Choices: {k.choices}." if k.choices else "")
        rows.append(f"| `{k.path}` | {k.type} | {cell(k.default)} | {meaning} |")
    return rows


def render(conf: Path) -> str:
    """docs/reference/config.md."""
    opts = options(conf)
    chosen = defaults(conf)
    out = [
        "# Configuration reference",
        "",
        "<!-- generated by `python -m hpctrain.docgen docs/reference` from hpctrain/config/ and "
        "conf/: do not edit -->",
        "",
        "Every key hpctrain reads, from the typed schema (`hpctrain/config/schema.py`), and every "
        "option of every config group (`conf/`). Set a key with `key=value` and pick an option "
        "with `group=option` on the command line (see {doc}`/tutorials/own-code` for your own "
        "options); an unknown key is an error that lists the valid ones.",
        "",
        "## Config groups",
        "",
        "| option | what it is | sets |",
        "|---|---|---|",
    ]
    for o in opts:
        mark = " (default)" if chosen.get(o.group) == o.name else ""
        out.append(f"| `{o.group}={o.name}`{mark} | {cell(o.about)} | {cell(o.sets)} |")
    for f in dataclasses.fields(Config):
        if f.name == "cluster":
            out += ["", "## cluster", "", cell(summary(ClusterConf)), ""]
            for title, ks in cluster_keys().items():
                out += [f"### {title}", "", *_key_table(ks), ""]
            continue
        section = _is_section(typing.get_type_hints(Config)[f.name])
        if section is None:
            continue
        about = (
            summary(section) if section.__doc__ and not section.__doc__.startswith(section.__name__) else ""
        )
        out += ["", f"## {f.name}", ""] + ([cell(about), ""] if about else [])
        out += _key_table(list(keys(section, f.name + ".")))
    return "\n".join(out).rstrip() + "\n"
