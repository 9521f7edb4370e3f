"""Intervals of positive quantities (throughput, speedup, efficiency) that never reach below zero.

With 3 or more repetitions: a 95% Student-t interval computed on the logarithms and mapped back
(the usual interval for a log-normal quantity), so it is asymmetric and always positive. With 2,
the t quantile (12.7 for one degree of freedom) makes that interval meaningless: min-max instead,
and the report says so. One run has no interval.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from hpctrain.analysis.metrics import t975

T95 = "95% CI (t, log space)"
MINMAX = "min–max (fewer than 3 repetitions)"
NONE = "none (one run)"


@dataclass(frozen=True)
class Interval:
    lo: float
    hi: float
    method: str  # T95 | MINMAX | NONE

    @property
    def known(self) -> bool:
        return self.method != NONE

    def scaled(self, k: float) -> Interval:
        return Interval(self.lo * k, self.hi * k, self.method)

    def text(self, fmt: str) -> str:
        return f"{format(self.lo, fmt)}–{format(self.hi, fmt)}" if self.known else "-"


def positive_interval(values: Sequence[float]) -> Interval:
    """The interval of the mean of positive samples; non-positive samples have no log, so they
    (a failed measurement) get no interval rather than a wrong one."""
    n = len(values)
    if n < 2 or min(values) <= 0:
        return Interval(math.nan, math.nan, NONE)
    if n < 3:
        return Interval(min(values), max(values), MINMAX)
    logs = [math.log(v) for v in values]
    centre = statistics.fmean(logs)
    half = t975(n - 1) * statistics.stdev(logs) / math.sqrt(n)
    return Interval(math.exp(centre - half), math.exp(centre + half), T95)


def _log_half(i: Interval) -> float:
    return math.log(i.hi / i.lo) / 2


def ratio_interval(num: float, num_i: Interval, den: float, den_i: Interval) -> Interval:
    """Interval of num / den from the intervals of both (independent measurements): t intervals
    add in quadrature in log space; with a min-max side, the extreme ratios; a side without an
    interval counts as exact."""
    known = [i for i in (num_i, den_i) if i.known]
    if not known:
        return Interval(math.nan, math.nan, NONE)
    if all(i.method == T95 for i in known):
        h = math.hypot(*(_log_half(i) for i in known))
        return Interval(num / den * math.exp(-h), num / den * math.exp(h), T95)
    lo_n, hi_n = (num_i.lo, num_i.hi) if num_i.known else (num, num)
    lo_d, hi_d = (den_i.lo, den_i.hi) if den_i.known else (den, den)
    return Interval(lo_n / hi_d, hi_n / lo_d, MINMAX)
