"""Scaling metrics. Pure functions; each formula names its source in one line."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from hpctrain.records.schedules import SCHEDULES

# Two-sided 95% Student t critical values t(0.975, df) for df = 1..30 (standard tables).
T975 = (
    12.7062,
    4.3027,
    3.1824,
    2.7764,
    2.5706,
    2.4469,
    2.3646,
    2.3060,
    2.2622,
    2.2281,
    2.2010,
    2.1788,
    2.1604,
    2.1448,
    2.1314,
    2.1199,
    2.1098,
    2.1009,
    2.0930,
    2.0860,
    2.0796,
    2.0739,
    2.0687,
    2.0639,
    2.0595,
    2.0555,
    2.0518,
    2.0484,
    2.0452,
    2.0423,
)


def t975(df: int) -> float:
    """t(0.975, df); beyond the table, the Cornish-Fisher expansion (Abramowitz & Stegun 26.7.5)."""
    if df <= len(T975):
        return T975[df - 1]
    z = 1.959964
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def mean_ci95(values: Sequence[float]) -> tuple[float, float]:
    """Mean and half-width of the 95% confidence interval (Student's t, n-1 degrees of freedom)."""
    n = len(values)
    if n == 0:
        return float("nan"), float("nan")
    m = statistics.fmean(values)
    if n == 1:
        return m, float("nan")
    return m, t975(n - 1) * statistics.stdev(values) / math.sqrt(n)


def speedup(throughput_n: float, throughput_1: float) -> float:
    """S(N) = X_N / X_1 (throughput form; equals T_1 / T_N for a fixed amount of work)."""
    return throughput_n / throughput_1


def efficiency(throughput_n: float, throughput_1: float, n: float) -> float:
    """Scaling efficiency E = X_N / (N * X_1) = S / N, in throughput form for both kinds: weak
    scaling (Gustafson 1988, as Horovod reports it) and strong scaling, where a fixed global batch
    B gives X = B / T and so E = T_1 / (N * T_N) (Amdahl's setting). One form keeps E = S / N
    and inside its interval when repetitions vary (the mean of B / T is not B / mean T)."""
    return throughput_n / (n * throughput_1)


def karp_flatt(speedup_n: float, n: float) -> float:
    """Experimentally determined serial fraction e = (1/S - 1/N) / (1 - 1/N) (Karp & Flatt 1990)."""
    if n <= 1 or not speedup_n > 0:
        return float("nan")
    return (1.0 / speedup_n - 1.0 / n) / (1.0 - 1.0 / n)


def amdahl_speedup(serial_fraction: float, n: float) -> float:
    """Amdahl's law S(N) = 1 / (s + (1 - s) / N) (Amdahl 1967)."""
    return 1.0 / (serial_fraction + (1.0 - serial_fraction) / n)


def through_origin(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float, int]:
    """Least squares y = b x without intercept: b = sum(x y) / sum(x^2), its standard error
    sqrt(sum(residual^2) / (k - 1) / sum(x^2)) and k - 1 degrees of freedom (NaN, 0 where undefined)."""
    den = sum(x * x for x in xs)
    if den <= 0:
        return float("nan"), float("nan"), 0
    b = sum(x * y for x, y in zip(xs, ys)) / den
    dof = len(xs) - 1
    if dof < 1:
        return b, float("nan"), 0
    return b, math.sqrt(sum((y - b * x) ** 2 for x, y in zip(xs, ys)) / dof / den), dof


def amdahl_with_se(ns: Sequence[float], speedups: Sequence[float]) -> tuple[float, float]:
    """Least-squares serial fraction s of Amdahl's law, from 1/S - 1/N = s (1 - 1/N) (linearised),
    and its standard error (NaN with fewer than two speedups)."""
    xs = [1.0 - 1.0 / n for n in ns]
    ys = [1.0 / s - 1.0 / n for n, s in zip(ns, speedups)]
    s, se, _ = through_origin(xs, ys)
    return s, se


def fit_amdahl(ns: Sequence[float], speedups: Sequence[float]) -> float:
    return amdahl_with_se(ns, speedups)[0]


def allreduce_bandwidths(size_bytes: float, seconds: float, n: int) -> tuple[float, float]:
    """(algbw, busbw) in bytes/s as nccl-tests defines them for allreduce:
    algbw = S / t, busbw = algbw * 2(n-1)/n (nccl-tests, doc/PERFORMANCE.md)."""
    algbw = size_bytes / seconds
    return algbw, algbw * 2.0 * (n - 1) / n


def gather_bandwidths(size_bytes: float, seconds: float, n: int) -> tuple[float, float]:
    """(algbw, busbw) for all-gather and reduce-scatter of S bytes in all: busbw = algbw (n-1)/n,
    each rank sends and receives (n-1)/n of the data (nccl-tests, doc/PERFORMANCE.md)."""
    algbw = size_bytes / seconds
    return algbw, algbw * (n - 1) / n


def pipeline_bubble(stages: int, microbatches: int, schedule: str = "gpipe", pieces: int = 1) -> float:
    """Idle share of a step with equal stages: the schedule's own formula (records/schedules.py);
    an unknown schedule (a record from a later hpctrain) as GPipe's."""
    return SCHEDULES.get(schedule, SCHEDULES["gpipe"]).bubble(stages, microbatches, pieces)
