"""The summary table's rows of each part of a run (records/parts.py), by the part's key: the
pipeline's idle, transfers and overhead beside the compute and its memory per stage, tensor
parallelism's collectives inside the compute. The table (commands/ui.py) asks each part of a
summary for its rows and never asks which parts there are.

A row is (place, metric, value, share of step); the places are where in the table it goes:
"compute" (under the compute row), "step" (after the step's parts), "memory" (under peak memory),
"advice" (prose below the table: the metric is the sentence, the other cells empty).
A part from another package registers its rows with `register_rows` beside `register_part`."""

from __future__ import annotations

from collections.abc import Callable

from hpctrain.records import RunSummary
from hpctrain.registry import load

Row = tuple[str, str, str, str]
RowsOf = Callable[[RunSummary], list[Row]]
PLACES = ("compute", "step", "memory", "advice")

# built-in parts' rows, imported on first use: "module:function"
_TARGETS: dict[str, str] = {
    "memory": "hpctrain.analysis.memory:report_rows",
}
_LOADED: dict[str, RowsOf] = {}


def register_rows(key: str) -> Callable[[RowsOf], RowsOf]:
    """A decorator: `fn(summary)` gives the table rows of the part `key`."""

    def deco(fn: RowsOf) -> RowsOf:
        _LOADED[key] = fn
        return fn

    return deco


def _rows_fn(key: str) -> RowsOf | None:
    if key not in _LOADED and key not in _TARGETS:
        from hpctrain.dimension_packages import by_part

        _TARGETS.update(by_part("report", "report_rows"))  # the packages' (dimension_packages.py)
    if key not in _LOADED and key in _TARGETS:
        _LOADED[key] = load(_TARGETS[key])
    return _LOADED.get(key)


def rows_of(s: RunSummary) -> dict[str, list[tuple[str, str, str]]]:
    """The rows every part of the run adds, by place, in the order of the parts."""
    out: dict[str, list[tuple[str, str, str]]] = {place: [] for place in PLACES}
    for key in s.parts:
        fn = _rows_fn(key)
        for place, *row in fn(s) if fn is not None else []:
            out[place].append((row[0], row[1], row[2]))
    return out
