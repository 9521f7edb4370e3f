"""YAML that a user or a run directory hands hpctrain, read with bounds before anything builds it:
its size (bounded.py), and the size it would expand to. Aliases make a small file expand without
limit (the "billion laughs": nine nested lists of nine aliases are 9**9 values), so Hydra and
OmegaConf would take minutes and gigabytes to compose it, deaf to Ctrl-C. The file is only
composed here (libyaml's node graph, in which an alias is the node it names, not a copy), and the
values it would expand to are counted over that graph, each node once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from hpctrain import bounded

PRESET_BYTES = bounded.SMALL  # a preset (an option of a config group): a few hundred bytes
MAX_VALUES = 100_000  # a run's config.yaml holds ~300; a preset's lists a few thousand at most

Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class BadYaml(ValueError):
    """The file is not YAML hpctrain reads: why, in words (the caller names the file)."""


def expanded(node: yaml.Node, seen: dict[int, int] | None = None, depth: int = 0) -> int:
    """How many values `node` expands to, aliases counted as often as they appear; each node of
    the graph visited once (memoized by identity). Pure."""
    seen = {} if seen is None else seen
    if id(node) in seen:
        return seen[id(node)]
    if depth > 200:
        raise BadYaml("nests deeper than 200 levels")
    seen[id(node)] = MAX_VALUES + 1  # a node that reaches itself (a recursive anchor) is unbounded
    if isinstance(node, yaml.MappingNode):
        n = 1 + sum(expanded(k, seen, depth + 1) + expanded(v, seen, depth + 1) for k, v in node.value)
    elif isinstance(node, yaml.SequenceNode):
        n = 1 + sum(expanded(v, seen, depth + 1) for v in node.value)
    else:
        n = 1
    seen[id(node)] = min(n, MAX_VALUES + 1)
    return seen[id(node)]


def _duplicate(node: yaml.Node, where: str = "") -> str | None:
    """The first key given twice in one mapping, as a dotted path; None if none. Pure."""
    if isinstance(node, yaml.MappingNode):
        keys: set[str] = set()
        for k, v in node.value:
            key = str(k.value) if isinstance(k, yaml.ScalarNode) else "?"
            path = f"{where}.{key}" if where else key
            if key in keys:
                return f"{path} (line {k.start_mark.line + 1})"
            keys.add(key)
            found = _duplicate(v, path)
            if found:
                return found
    elif isinstance(node, yaml.SequenceNode):
        for i, v in enumerate(node.value):
            found = _duplicate(v, f"{where}[{i}]")
            if found:
                return found
    return None


def compose(text: str) -> yaml.Node | None:
    """The document's node graph, refused (BadYaml) if it is not one YAML document, expands past
    MAX_VALUES, or gives a key twice in one mapping."""
    try:
        node = yaml.compose(text, Loader=Loader)
    except yaml.MarkedYAMLError as e:
        where = f"line {e.problem_mark.line + 1}: " if e.problem_mark else ""
        raise BadYaml(f"is not YAML ({where}{e.problem or e.context})") from None
    except yaml.YAMLError as e:
        raise BadYaml(f"is not YAML ({str(e).splitlines()[0]})") from None
    except RecursionError:
        raise BadYaml("nests deeper than Python can read") from None
    if node is None:
        return None
    if expanded(node) > MAX_VALUES:
        raise BadYaml(f"expands to more than {MAX_VALUES:,} values (aliases of aliases: a YAML bomb)")
    dup = _duplicate(node)
    if dup:
        raise BadYaml(f"gives the key {dup} twice")
    return node


def load(path: Path, limit: int) -> Any:
    """The file's YAML, read with a size bound and composed with compose()'s bounds. BadYaml for
    every way it cannot be read, in words."""
    try:
        text = bounded.read_text(path, limit)
    except OSError as e:
        raise BadYaml(f"cannot be read ({e.strerror or e})") from None
    except UnicodeDecodeError as e:
        raise BadYaml(f"is not UTF-8 text (byte {e.start}: {e.reason})") from None
    node = compose(text)
    return None if node is None else yaml.load(text, Loader=Loader)


def preset_problem(path: Path) -> str | None:
    """Why a preset (a config file on the search path) cannot be used, or None: it cannot be
    read within the bounds, is not a mapping, or sets Hydra's own options, which hpctrain sets."""
    try:
        data = load(path, PRESET_BYTES)
    except BadYaml as e:
        return str(e)
    if data is not None and not isinstance(data, dict):
        return f"is a YAML {type(data).__name__}, not a mapping of keys to values"
    if isinstance(data, dict) and "hydra" in data:
        return "sets `hydra:` options, which hpctrain sets itself (they would be ignored)"
    return None
