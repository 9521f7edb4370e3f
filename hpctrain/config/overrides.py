"""What hpctrain does to overrides before Hydra reads them: the short forms (`script=train.py`),
a bound on how deep a value nests (Hydra's parser recurses once a level), and maps assigned whole
(`parallelism.tp.plan={...}`: Hydra would merge into the typed, empty map and refuse every key)."""

from __future__ import annotations

import dataclasses
import sys
import typing
from collections.abc import Sequence
from functools import cache

from hpctrain.config.schema import CLUSTER_SCHEMAS, Config
from hpctrain.errors import ConfigError, Problem

MAX_DEPTH = 64


def _depth(text: str) -> int:
    """How deep brackets and braces nest in an override (quotes are not parsed: a bound, not a
    grammar; Hydra's parser says what is wrong with a value that passes it)."""
    depth = deepest = 0
    for ch in text:
        if ch in "[{(":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]})":
            depth -= 1
    return deepest


def normalise(overrides: Sequence[str]) -> list[str]:
    """`script=train.py` is short for `script.path=train.py` (the issue's and torchrun's way);
    `cluster.container=IMAGE.sif`, the key before runtimes existed, still means Apptainer."""
    out = []
    deep = [o for o in overrides if _depth(o) > MAX_DEPTH]
    if deep:  # Hydra's parser recurses once a level: a deep one would end in a RecursionError
        raise ConfigError(
            [
                Problem(
                    o.split("=")[0][:80],
                    f"nests lists or maps {_depth(o)} levels deep; hpctrain reads at most {MAX_DEPTH}",
                    "flatten the value",
                )
                for o in deep
            ]
        )
    for o in overrides:
        if o.startswith("script="):
            out.append(f"script.path={o[len('script=') :]}")
        elif o.startswith("cluster.container=") and not o.startswith("cluster.container={"):
            image = o[len("cluster.container=") :]
            print(
                f"hpctrain: {o} is deprecated; it means cluster.container.runtime=apptainer "
                f"cluster.container.image={image}",
                file=sys.stderr,
            )
            out += ["cluster.container.runtime=apptainer", f"cluster.container.image={image}"]
        elif (key := o.split("=", 1)[0]) in map_keys() and o[len(key) + 1 :].lstrip().startswith("{"):
            out.append(f"++{o}")  # assigned whole: the map's own keys are the user's (a plan, env)
        else:
            out.append(o)
    return out


@cache
def map_keys() -> frozenset[str]:
    """The schema's keys whose value is a map of the user's own keys (Dict[str, ...] fields)."""
    found: set[str] = set()

    def walk(schema: type, prefix: str) -> None:
        if not dataclasses.is_dataclass(schema):
            return
        hints = typing.get_type_hints(schema)
        for f in dataclasses.fields(schema):
            t = hints[f.name]
            if typing.get_origin(t) is typing.Union:  # Optional[X] -> X
                t = next(a for a in typing.get_args(t) if a is not type(None))
            if typing.get_origin(t) is dict:
                found.add(prefix + f.name)
            elif isinstance(t, type) and dataclasses.is_dataclass(t):
                walk(t, f"{prefix}{f.name}.")

    walk(Config, "")
    for schema in CLUSTER_SCHEMAS.values():
        walk(schema, "cluster.")
    return frozenset(found)


def chosen_twice(overrides: Sequence[str], where: str) -> list[str]:
    """Notes for a config group chosen twice in one place (`model=mlp model=cnn`), which Hydra
    resolves by taking the last without a word. Said, not refused: scripts build command lines
    from a base and a variant, and an overrides file's choices are meant to be overridden."""
    seen: dict[str, str] = {}
    notes = []
    for o in overrides:
        key = o.split("=", 1)[0].lstrip("+~")
        if key in seen and "=" in o and "." not in key:
            notes.append(f"{key} is chosen twice {where} ({seen[key]}, then {o}): {o} counts")
        seen[key] = o
    return notes
