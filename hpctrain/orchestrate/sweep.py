"""Sweeps: Hydra's override grammar (`a=1,2 b=range(3)`, choice, glob) expanded into points,
each validated before anything is submitted."""

from __future__ import annotations

import math
from collections.abc import Sequence
from decimal import Decimal

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ChoiceSweep, Glob, Override, RangeSweep, Sweep
from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException

from hpctrain.errors import ConfigError, Problem
from hpctrain.records import State

MAX_POINTS = 100_000  # planned and submitted in seconds (hpctrain bench submit); scheduler limits still apply


def expand(overrides: Sequence[str], config_dir: str | None = None) -> list[list[str]]:
    """The cartesian product of the sweep overrides, in Hydra's BasicSweeper order. The parser
    gets a config loader, as in a Hydra app, so that glob(...) can list a config group's options."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.utils import create_config_search_path

    from hpctrain.config.overrides import normalise
    from hpctrain.config.schema import register
    from hpctrain.config.search import search_path

    register()
    found = search_path(config_dir)
    csp = create_config_search_path(str(found.shipped))
    for s in found.added:  # as hydra.searchpath appends them: glob(...) lists their options too
        csp.append(s.origin, f"file://{s.path}")
    loader = ConfigLoaderImpl(config_search_path=csp)
    try:
        parsed = OverridesParser.create(config_loader=loader).parse_overrides(normalise(overrides))
    except HydraException as e:
        raise _syntax(str(e).splitlines()[0]) from e
    count(parsed)  # before expanding: a range of 10^8 would take minutes and gigabytes to list
    try:
        points = [p for batch in BasicSweeper.split_arguments(parsed, None) for p in batch]
    except (HydraException, OmegaConfBaseException, ValueError) as e:
        raise _syntax(str(e).splitlines()[0]) from e
    return points


def count(parsed: Sequence[Override]) -> int:
    """How many points the overrides make, counted without listing them; ConfigError past
    MAX_POINTS, for none, or for a sweep hpctrain cannot enumerate."""
    sizes = {o.key_or_group: _values(o) for o in parsed}
    total = math.prod(sizes.values())
    if total == 0:
        empty = next(k for k, n in sizes.items() if n == 0)
        raise _syntax(f"{empty} lists no values, so the sweep has no points")
    if total > MAX_POINTS:
        raise ConfigError(
            [
                Problem(
                    "<sweep>",
                    f"{total} points exceed the limit of {MAX_POINTS}",
                    "split the sweep into smaller ones",
                )
            ]
        )
    return total


def _values(o: Override) -> int:
    """How many values one override sweeps (1 if it sets one)."""
    if not o.is_sweep_override():
        return 1
    v, key = o.value(), o.key_or_group
    if isinstance(v, RangeSweep):
        return _range_length(key, v)
    if isinstance(v, ChoiceSweep):
        if any(isinstance(x, Sweep) for x in v.list):
            raise _syntax(f"{key}: a choice cannot hold another sweep (choice, range, glob)")
        return len(v.list)
    if isinstance(v, Glob):
        n = sum(1 for _ in o.sweep_string_iterator())
        if n == 0:
            options = o.config_loader.get_group_options(key) if o.config_loader else []
            raise _syntax(
                f"{o.input_line or key} matches none of the options of {key} ({', '.join(options)})"
            )
        return n
    raise _syntax(
        f"{key}: {o.value_type.name.lower() if o.value_type else 'this'} cannot be enumerated (interval is for optimizers)"
    )


def _range_length(key: str, r: RangeSweep) -> int:
    """The values Hydra's range() lists: Python's range for ints, Decimal steps otherwise."""
    if r.start is None or r.stop is None or r.step == 0:
        raise _syntax(f"{key}: range(start, stop[, step]) needs a start, a stop and a step that is not 0")
    if all(isinstance(x, int) for x in (r.start, r.stop, r.step)):
        return len(range(int(r.start), int(r.stop), int(r.step)))
    span = (Decimal(r.stop) - Decimal(r.start)) / Decimal(r.step)
    return max(0, math.ceil(span))


def _syntax(why: str) -> ConfigError:
    return ConfigError(
        [
            Problem(
                "<sweep>",
                f"cannot expand the sweep: {why}",
                "use Hydra's sweep syntax: key=a,b,c, key=range(1,4) or group=glob(*)",
            )
        ]
    )


def split_common(points: Sequence[Sequence[str]]) -> tuple[list[str], list[list[str]]]:
    """(the overrides every point shares, each point's others): tables show the shared ones once,
    above, and per row only what varies. One point alone has nothing that varies."""
    if not points:
        return [], []
    common = [o for o in points[0] if all(o in p for p in points[1:])] if len(points) > 1 else list(points[0])
    return common, [[o for o in p if o not in common] for p in points]


# `hpctrain status` order: what needs attention first (failed, then running), then the rest.
STATE_ORDER = {
    State.FAILED: 0,
    State.TIMEOUT: 0,
    State.OUT_OF_MEMORY: 0,
    State.NODE_FAIL: 0,
    State.CANCELLED: 0,
    State.RUNNING: 1,
}


def state_rank(state: str) -> int:
    return STATE_ORDER.get(State.of(state), 2)
