"""Sweeps: Hydra's override grammar (`a=1,2 b=range(3)`, choice, glob) expanded into points,
each validated before anything is submitted."""

from __future__ import annotations

from collections.abc import Sequence

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException

from .errors import ConfigError, Problem

MAX_POINTS = 4096


def expand(overrides: Sequence[str]) -> list[list[str]]:
    """The cartesian product of the sweep overrides, in Hydra's BasicSweeper order."""
    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
        points = [p for batch in BasicSweeper.split_arguments(parsed, None) for p in batch]
    except HydraException as e:
        raise ConfigError(
            [
                Problem(
                    "<sweep>",
                    f"cannot expand the sweep: {str(e).splitlines()[0]}",
                    "use Hydra's sweep syntax: key=a,b,c or key=range(1,4)",
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
