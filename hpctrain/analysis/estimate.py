"""Estimates before submitting: each point's step time, throughput, wall time, node-hours and
core-hours, each with an interval, from what a probe run (or an earlier run or study of the same
config) measured. Pure: the measurements come in (analysis/evidence.py reads them), the figures
go out.

A run of S steps, W of them warm-up, takes

    wall(S) = setup + fixed + W x warm-up step + (S - W) x step

setup: from the launch to the training's first step (interpreters, imports, the world meeting,
the probes); fixed: inside the training but outside its steps (the final checkpoint, the
summary). Both are measured, as the warm-up steps are, and carried to other scales unchanged
(the warm-up steps in proportion to the step). The step is measured where the evidence ran the
same world size, batch and threads; elsewhere the step model gives it (analysis/stepmodel.py).
The wall time's band is the steps' band plus the setup's own spread between launches.

Intervals are log-symmetric bands, as the study's predictions are: the truth is expected within
x / (1 + band) .. x (1 + band). At a measured scale the band is the step's own spread there
(p95 over p50, at least MIN_BAND). Elsewhere it is the model's largest leave-one-out error when
a study gave one (never less than the spread of the scale it starts from); from a single run, with nothing to test the model against, the measured spread
plus the share of the step the model extrapolates (communication and the wait for the slowest
rank), as if those terms were known to a factor of two.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from hpctrain.analysis.stepmodel import StepModel

MIN_BAND = 0.05  # a probe's few steps never pin the step down closer than this
# how much the time before the first step varies between launches of one config, when the evidence
# has a single run to tell (interpreters, imports and the world's meeting on a shared machine:
# 2.0 to 2.8 s on this one, `hpctrain bench estimate`); with repetitions, their own range
SETUP_BAND = 0.2


@dataclass(frozen=True)
class Band:
    """A positive value and its log-symmetric interval."""

    value: float
    band: float  # relative

    @property
    def lo(self) -> float:
        return self.value / (1 + self.band)

    @property
    def hi(self) -> float:
        return self.value * (1 + self.band)

    def text(self, fmt: str, scale: float = 1.0) -> str:
        v = self.value * scale
        if not math.isfinite(v):
            return "-"
        return f"{format(v, fmt)} ({format(self.lo * scale, fmt)}–{format(self.hi * scale, fmt)})"


@dataclass(frozen=True)
class Measured:
    """One scale the evidence measured (means over its runs)."""

    n: int  # world size
    nodes: int
    batch_per_rank: float
    threads: int  # torch threads per rank (0: not recorded)
    step_s: float  # the timed steps' mean
    spread: float  # the step's relative spread: p95 / p50 - 1
    warm_step_s: float  # a warm-up step's mean (0: the run had none)
    setup_s: float
    fixed_s: float
    runs: int = 1
    setup_spread: float = SETUP_BAND  # relative: the range of setup_s over repetitions


@dataclass(frozen=True)
class Evidence:
    source: str  # the run, study or probe it comes from
    scales: tuple[Measured, ...]
    model: StepModel | None  # None: no communication model (one rank, or no benchmark)
    loo_band: float = math.nan  # the model's largest leave-one-out error (NaN: none to test)
    what: tuple[tuple[str, str], ...] = ()  # model, precision, engine, parallelism as recorded

    def match(self, n: int, batch_per_rank: float, threads: int) -> Measured | None:
        """The scale measured with exactly this world size, batch per rank and threads."""
        for m in self.scales:
            if m.n == n and math.isclose(m.batch_per_rank, batch_per_rank) and m.threads in (threads, 0):
                return m
        return None

    def nearest(self, n: int) -> Measured:
        return min(self.scales, key=lambda m: (abs(math.log2(m.n / n)), -m.n))


@dataclass(frozen=True)
class Target:
    """A point about to be submitted, as the estimate needs it."""

    label: str
    n: int
    nodes: int
    batch_per_rank: float
    threads: int
    steps: int
    warmup_steps: int
    cores: int  # ranks x threads per rank: what core-hours count
    time_limit_s: float = math.inf  # the job's time limit (inf: none, a local run)
    requeues: bool = False  # it checkpoints and may be requeued at its time limit


@dataclass(frozen=True)
class PointEstimate:
    target: Target
    step_s: Band
    throughput: Band  # samples/s
    wall_s: Band
    node_hours: Band
    core_hours: Band
    how: str  # "measured at this scale" or where the model took it from
    over_limit: str = ""  # why and how to fix it when the wall time may exceed the time limit


class NoEstimate(ValueError):
    """The evidence cannot say anything about this point (the message says why)."""


def estimate_point(ev: Evidence, t: Target) -> PointEstimate:
    same = ev.match(t.n, t.batch_per_rank, t.threads)
    if same is not None:
        src, step, band = same, same.step_s, max(same.spread, MIN_BAND)
        how = f"measured at N={t.n}"
    else:
        step, band, how = _modelled(ev, t)
        src = ev.nearest(t.n)
    warm = t.warmup_steps * src.warm_step_s * step / src.step_s
    steady = max(t.steps - t.warmup_steps, 0) * step
    fixed = src.setup_s + src.fixed_s
    wall = fixed + warm + steady
    # the steps carry the step's band, the launch its own spread
    hi = fixed + src.setup_s * src.setup_spread + (warm + steady) * (1 + band)
    wall_band = hi / wall - 1 if wall > 0 else band
    hours = wall / 3600
    est = PointEstimate(
        t,
        Band(step, band),
        Band(t.batch_per_rank * t.n / step, band),
        Band(wall, wall_band),
        Band(t.nodes * hours, wall_band),
        Band(t.cores * hours, wall_band),
        how,
    )
    return replace(est, over_limit=over_limit(est))


def _modelled(ev: Evidence, t: Target) -> tuple[float, float, str]:
    m = ev.model
    if m is None:
        raise NoEstimate(
            f"{t.label}: the evidence ({ev.source}) measured {', '.join(f'N={s.n}' for s in ev.scales)} "
            f"and cannot extrapolate to N={t.n} (no communication model: it ran one rank or had no "
            "allreduce benchmark)"
        )
    if not m.described:
        raise NoEstimate(f"{t.label}: the step model does not describe {ev.source}: {m.problems[0]}")
    e = m.estimate(t.n, t.batch_per_rank, t.threads)
    step = e.step_s
    near = ev.nearest(t.n)
    measured = max(near.spread, MIN_BAND)  # never surer than the scale it starts from
    if math.isfinite(ev.loo_band):
        return step, max(ev.loo_band, measured), f"step model ({len(ev.scales)} scales, leave-one-out band)"
    extrapolated = (e.comm_s + e.wait_s) / step if step > 0 else 1.0
    band = measured + extrapolated
    return step, band, f"step model from N={near.n} (one scale: communication known to 2x)"


def over_limit(e: PointEstimate) -> str:
    """Why the run may not fit its time limit, and what to change; "" when it fits."""
    t, limit = e.target, e.target.time_limit_s
    if not math.isfinite(limit) or e.wall_s.hi <= limit:
        return ""
    likely = "will exceed" if e.wall_s.value > limit else "may exceed"
    fixes = [
        f"cluster.time_min={math.ceil(e.wall_s.hi * 1.1 / 60)}",
        f"train.steps={max(int(t.steps * limit / e.wall_s.hi), 1)} (what fits)",
    ]
    if not t.requeues:
        fixes.append("or checkpoint and requeue: cluster.checkpoint_interval=N cluster.max_requeues=K")
    return f"{likely} its time limit of {limit / 60:g} min (up to {e.wall_s.hi / 60:.1f} min): " + ", ".join(
        fixes
    )


def total(points: Sequence[PointEstimate]) -> tuple[Band, Band, Band]:
    """Wall time one after another, node-hours and core-hours of the whole submission: sums of
    the values and of the upper ends (the points' errors come from one model and move together,
    so they add rather than cancel)."""

    def summed(key: str) -> Band:
        bands = [getattr(p, key) for p in points]
        value = sum(b.value for b in bands)
        hi = sum(b.hi for b in bands)
        return Band(value, hi / value - 1 if value > 0 else math.nan)

    return summed("wall_s"), summed("node_hours"), summed("core_hours")
