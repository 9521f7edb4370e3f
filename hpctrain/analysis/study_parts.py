"""What each part of a study's runs (records/parts.py) adds to its report: the figures of a point
(its repetitions' means), columns of the points table, bars of the step breakdown, the time the
step model counts as the layout's idle term, and a section of the report. The analysis asks each
part the runs hold and never asks which parts there are (issue 73).

A part's study view is declared once, as a StudyPart, and found by the part's key: the built-in
ones are imported on first use ("module:attribute", as part_rows.py's rows); a part from another
package registers its own with `register_study_part`."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from hpctrain.dimension_packages import by_part
from hpctrain.records import RunSummary
from hpctrain.registry import load

Figures = Mapping[str, float]


def _none_cells(figures: Figures, step_s: float) -> list[str]:
    return []


def _no_figures(runs: Sequence[RunSummary], step_s: float) -> dict[str, float]:
    return {}


def _no_lines(runs: Sequence[RunSummary]) -> list[str]:
    return []


def _nothing(run: RunSummary) -> str:
    return ""


@dataclass(frozen=True)
class StudyPart:
    """A part's view of a study. `figures(runs, step_s)`: a point's figures from its repetitions
    (their mean step `step_s`); `columns` and `cells(figures, step_s)`: its columns of the points
    table ("-" where a point has nothing to show: the column is left out when no point has);
    `bars`: its bars of the step breakdown plot (label, figure in seconds); `idle`: the figure the
    step model carries over as the layout's idle term (""; none); `section`: a headed list of
    the report, `label` what its lines are called alone, and `lines` how they are made from all
    the study's runs. A run's series: `layout(run)`, what the part adds to its layout's name
    (" tp=2"), and `variant(run)`, a setting its series differ by ("m=4", shown where it varies).
    Every built-in view is asked for these of every run, whether the run holds its part or not."""

    figures: Callable[[Sequence[RunSummary], float], dict[str, float]] = _no_figures
    columns: tuple[str, ...] = ()
    cells: Callable[[Figures, float], list[str]] = _none_cells
    bars: tuple[tuple[str, str], ...] = ()
    idle: str = ""
    section: str = ""
    label: str = ""
    lines: Callable[[Sequence[RunSummary]], list[str]] = _no_lines
    layout: Callable[[RunSummary], str] = _nothing
    variant: Callable[[RunSummary], str] = _nothing


# built-in parts' study views, imported on first use: "module:attribute" of the packages'
# (dimension_packages.py), in their order
BUILTIN: dict[str, str] = by_part("report", "STUDY")
_LOADED: dict[str, StudyPart] = {}


def register_study_part(key: str, view: StudyPart) -> None:
    """Make `view` the study view of the part `key` (a part from another package)."""
    _LOADED[key] = view


def study_part(key: str) -> StudyPart | None:
    if key not in _LOADED and key in BUILTIN:
        _LOADED[key] = load(BUILTIN[key])
    return _LOADED.get(key)


def series_key(run: RunSummary) -> tuple[str, str, str]:
    """(its layout: the parallelism and what each part adds, its engine, its variants): the runs of
    one series share it."""
    views = [v for key in dict.fromkeys([*BUILTIN, *run.parts]) if (v := study_part(key)) is not None]
    layout = run.parallelism + "".join(v.layout(run) for v in views)
    return layout, run.engine, " ".join(x for v in views if (x := v.variant(run)))


def study_parts(runs: Sequence[RunSummary]) -> dict[str, StudyPart]:
    """The study views of the parts the runs hold, in the order they first appear (the built-in
    ones first, in their table's order, so that a report does not depend on which run was read first)."""
    held = {k for r in runs for k in r.parts}
    keys = [k for k in dict.fromkeys([*BUILTIN, *(k for r in runs for k in r.parts)]) if k in held]
    return {key: view for key in keys if (view := study_part(key)) is not None}
