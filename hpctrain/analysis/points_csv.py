"""points.csv: the points table as plain numbers, one column per quantity, for pandas or a
spreadsheet. Units are in the column names (`_s`, `_ms`, `_mib`, `_samples_per_s`); shares and
efficiencies are fractions (0.731, not "73.1%"); an interval's bounds have columns of their own
(`_lo`, `_hi`); an unknown figure is an empty cell (pandas reads NaN). A part's figures
(analysis/study_parts.py: a pipeline's bubble, context parallelism's K/V exchange) follow the
shares, named `<part>_<figure>` as the part names them. Pure."""

from __future__ import annotations

import math
from collections.abc import Callable

from hpctrain.analysis.analyze import Analysis, Point
from hpctrain.analysis.uncertainty import Interval


def _lo(get: Callable[[Point], Interval]) -> Callable[[Point], float]:
    return lambda p: get(p).lo if get(p).known else math.nan


def _hi(get: Callable[[Point], Interval]) -> Callable[[Point], float]:
    return lambda p: get(p).hi if get(p).known else math.nan


def _error(model: float, measured: float) -> float:
    return model / measured - 1 if measured > 0 else math.nan


# (column, figure of a point) before the parts' columns; "_lo"/"_hi" pairs from one interval
BEFORE: tuple[tuple[str, Callable[[Point], float]], ...] = (
    ("throughput_samples_per_s", lambda p: p.throughput),
    ("throughput_lo_samples_per_s", _lo(lambda p: p.throughput_ci)),
    ("throughput_hi_samples_per_s", _hi(lambda p: p.throughput_ci)),
    ("speedup", lambda p: p.speedup),
    ("speedup_lo", _lo(lambda p: p.speedup_ci)),
    ("speedup_hi", _hi(lambda p: p.speedup_ci)),
    ("efficiency", lambda p: p.efficiency),
    ("efficiency_lo", _lo(lambda p: p.efficiency_ci)),
    ("efficiency_hi", _hi(lambda p: p.efficiency_ci)),
    ("mfu", lambda p: p.mfu),
    ("comm_share", lambda p: p.comm_share),
    ("wait_share", lambda p: p.imbalance_s / p.step_s if p.n > 1 and p.step_s > 0 else math.nan),
    ("data_share", lambda p: p.data_share),
)
AFTER: tuple[tuple[str, Callable[[Point], float]], ...] = (
    ("peak_mib", lambda p: max(p.peak_by_stage) / 2**20 if p.peak_by_stage else math.nan),
    ("state_mib", lambda p: p.state_bytes / 2**20),
    ("karp_flatt_e", lambda p: p.karp_flatt),
    ("step_ms", lambda p: 1e3 * p.step_s),
    ("node_hours", lambda p: p.node_hours),
    ("node_hours_per_1k_samples", lambda p: p.node_hours_per_1k),
    ("model_step_ms", lambda p: 1e3 * p.model_step_s),
    ("model_error", lambda p: _error(p.model_step_s, p.step_s)),
    ("loo_error", lambda p: _error(p.loo_step_s, p.step_s)),
)


def part_columns(a: Analysis) -> list[tuple[str, str]]:
    """(part key, figure name) of every figure a point of the study holds, in the parts' order."""
    out: dict[tuple[str, str], None] = {}
    for key in a.parts:
        for p in (p for s in a.series for p in s.points):
            out.update(dict.fromkeys((key, name) for name in p.parts.get(key, {})))
    return list(out)


def csv_columns(a: Analysis) -> list[str]:
    parts = [f"{key}_{name}" for key, name in part_columns(a)]
    return ["series", "ranks", "reps", *(c for c, _ in BEFORE), *parts, *(c for c, _ in AFTER)]


def _cell(x: float) -> str:
    return "" if x is None or not math.isfinite(x) else repr(float(x))


def csv_rows(a: Analysis) -> list[list[str]]:
    """One row per point of each series, in csv_columns' order."""
    parts = part_columns(a)
    return [
        [
            s.label,
            str(p.n),
            str(p.reps),
            *(_cell(f(p)) for _, f in BEFORE),
            *(_cell(p.parts.get(key, {}).get(name, math.nan)) for key, name in parts),
            *(_cell(f(p)) for _, f in AFTER),
        ]
        for s in a.series
        for p in s.points
    ]
