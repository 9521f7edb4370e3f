"""Sweeps: Hydra's override grammar (`a=1,2 b=range(3)`, choice, glob) expanded into points,
each validated before anything is submitted."""

from __future__ import annotations

from collections.abc import Sequence

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException

from hpctrain.errors import ConfigError, Problem

MAX_POINTS = 100_000  # planned and submitted in seconds (hpctrain bench submit); scheduler limits still apply


def expand(overrides: Sequence[str], config_dir: str | None = None) -> list[list[str]]:
    """The cartesian product of the sweep overrides, in Hydra's BasicSweeper order. The parser
    gets a config loader, as in a Hydra app, so that glob(...) can list a config group's options."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.utils import create_config_search_path

    from hpctrain.config.load import conf_dir, normalise
    from hpctrain.config.schema import register

    register()
    loader = ConfigLoaderImpl(config_search_path=create_config_search_path(str(conf_dir(config_dir))))
    try:
        parsed = OverridesParser.create(config_loader=loader).parse_overrides(normalise(overrides))
        points = [p for batch in BasicSweeper.split_arguments(parsed, None) for p in batch]
    except HydraException as e:
        raise ConfigError(
            [
                Problem(
                    "<sweep>",
                    f"cannot expand the sweep: {str(e).splitlines()[0]}",
                    "use Hydra's sweep syntax: key=a,b,c, key=range(1,4) or group=glob(*)",
                )
            ]
        ) from e
    if len(points) > MAX_POINTS:
        raise ConfigError(
            [
                Problem(
                    "<sweep>",
                    f"{len(points)} points exceed the limit of {MAX_POINTS}",
                    "split the sweep into smaller ones",
                )
            ]
        )
    return points


def split_common(points: Sequence[Sequence[str]]) -> tuple[list[str], list[list[str]]]:
    """(the overrides every point shares, each point's others): tables show the shared ones once,
    above, and per row only what varies. One point alone has nothing that varies."""
    if not points:
        return [], []
    common = [o for o in points[0] if all(o in p for p in points[1:])] if len(points) > 1 else list(points[0])
    return common, [[o for o in p if o not in common] for p in points]


# `hpctrain status` order: what needs attention first (failed, then running), then the rest.
STATE_ORDER = {"FAILED": 0, "TIMEOUT": 0, "OUT_OF_MEMORY": 0, "NODE_FAIL": 0, "CANCELLED": 0, "RUNNING": 1}


def state_rank(state: str) -> int:
    return STATE_ORDER.get(state.split()[0] if state else state, 2)
