"""Collect a study's run directories and compute its scaling figures. Reading is tolerant:
failed or missing runs are listed, never fatal."""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import records
from ..errors import RecordError
from ..train.stats import share
from . import metrics
from .model import AlphaBeta, StepModel, fit_alpha_beta, fit_step_model


@dataclass(frozen=True)
class Run:
    n: int  # world size
    rep: int
    batch_per_rank: int
    global_batch: int
    throughput: float
    step_s: float
    compute_s: float
    comm_s: float
    data_s: float
    parameters: int
    grad_bytes_per_param: int
    engine: str = "horovod"
    bubble_s: float = 0.0
    stages: int = 1
    microbatches: int = 1
    peak_by_stage: tuple[int, ...] = ()  # peak memory of the rank holding most, per stage


@dataclass
class Point:
    n: int
    reps: int
    throughput: float
    throughput_ci95: float
    step_s: float
    compute_s: float
    comm_s: float
    data_s: float
    batch_per_rank: float
    speedup: float = float("nan")
    efficiency: float = float("nan")
    karp_flatt: float = float("nan")
    comm_share: float = float("nan")
    data_share: float = float("nan")
    model_step_s: float = float("nan")
    bubble_share: float = float("nan")  # pipelines only
    bubble_theory: float = float("nan")  # (p - 1) / (m + p - 1)
    peak_by_stage: tuple[float, ...] = ()  # bytes, mean over repetitions


# The allreduce benchmark's column that times the collective each engine uses (bench/allreduce_worker.py).
# Other engines (a script's own) are modelled with Horovod's.
ALLREDUCE_S = {"horovod": "hvd_s", "ddp": "torch_s"}


@dataclass
class Series:
    """One engine's points and the fits made from them."""

    engine: str
    kind: str  # strong | weak
    points: list[Point]
    amdahl_serial_fraction: float  # NaN when the runs show no speedup to fit
    alpha_beta: AlphaBeta | None = None
    step_model: StepModel | None = None
    predictions: list[dict[str, float]] = field(default_factory=list)
    label: str = ""  # how tables and plots name it: the engine, and the micro-batches if they vary

    @property
    def no_speedup(self) -> bool:
        """Amdahl's law cannot describe runs that got slower with more ranks (fitted s >= 1)."""
        multi = [p for p in self.points if p.n > self.points[0].n] if self.points else []
        return bool(multi) and (not self.amdahl_serial_fraction < 1 or any(p.speedup < 1 for p in multi))


@dataclass
class Analysis:
    """A study: one series per engine and micro-batch count (one unless study.engines or
    study.microbatches compares them)."""

    kind: str  # strong | weak
    series: list[Series]
    missing: list[str]  # run directories without a summary (failed, cancelled, not run)
    allreduce: list[dict[str, Any]] = field(default_factory=list)  # bench rows, all world sizes
    corrupt: list[str] = field(default_factory=list)  # "<file>: what is wrong", for unreadable records

    @property
    def points(self) -> list[Point]:
        return [p for s in self.series for p in s.points]

    @property
    def compares(self) -> bool:
        return len(self.series) > 1


def run_from_records(run_dir: Path, rep: int = 0) -> Run:
    """A study's run from its summary.json; RecordMissing/RecordError if it has none or a bad one."""
    s = records.read(run_dir / records.SUMMARY, records.RunSummary)
    return Run(
        n=s.world_size,
        rep=rep,
        batch_per_rank=s.batch_per_rank,
        global_batch=s.global_batch,
        throughput=s.throughput_samples_per_s,
        step_s=s.step_s,
        compute_s=s.compute_s,
        comm_s=s.comm_s,
        data_s=s.data_s,
        parameters=s.parameters,
        grad_bytes_per_param=s.grad_bytes_per_param,
        engine=s.engine,
        bubble_s=s.bubble_s,
        stages=s.stages,
        microbatches=s.microbatches,
        peak_by_stage=tuple(
            max(r.peak_memory_bytes for r in s.per_rank if r.stage == k)
            for k in sorted({r.stage for r in s.per_rank})
        ),
    )


def aggregate(kind: str, runs: list[Run]) -> list[Point]:
    by_n: dict[int, list[Run]] = defaultdict(list)
    for r in runs:
        by_n[r.n].append(r)
    points = []
    for n in sorted(by_n):
        rs = by_n[n]
        mean, ci = metrics.mean_ci95([r.throughput for r in rs])
        avg = lambda k: statistics.fmean(getattr(r, k) for r in rs)  # noqa: E731
        p = Point(
            n,
            len(rs),
            mean,
            ci,
            avg("step_s"),
            avg("compute_s"),
            avg("comm_s"),
            avg("data_s"),
            avg("batch_per_rank"),
        )
        p.comm_share, p.data_share = share(p.comm_s, p.step_s), share(p.data_s, p.step_s)
        if rs[0].stages > 1:
            p.bubble_share = share(avg("bubble_s"), p.step_s)
            p.bubble_theory = metrics.pipeline_bubble(rs[0].stages, rs[0].microbatches)
        if all(len(r.peak_by_stage) == len(rs[0].peak_by_stage) for r in rs):
            p.peak_by_stage = tuple(statistics.fmean(col) for col in zip(*(r.peak_by_stage for r in rs)))
        points.append(p)
    if not points:
        return points
    base = points[0]  # the smallest measured scale is the reference (normally N = 1)
    for p in points:
        rel = p.n / base.n
        p.speedup = metrics.speedup(p.throughput, base.throughput)
        p.efficiency = (
            metrics.strong_efficiency(base.step_s, p.step_s, rel)
            if kind == "strong"
            else metrics.weak_efficiency(p.throughput, base.throughput, rel)
        )
        p.karp_flatt = metrics.karp_flatt(p.speedup, rel) if kind == "strong" else float("nan")
    return points


def analyze_series(
    kind: str, runs: list[Run], allreduce: list[dict[str, Any]] | None = None, engine: str = "horovod"
) -> Series:
    """The figures of one engine's runs; `allreduce`: benchmark rows for the alpha-beta fit."""
    points = aggregate(kind, runs)
    multi = [p for p in points if p.n > points[0].n] if points else []
    if kind == "strong":
        amdahl = (
            metrics.fit_amdahl([p.n / points[0].n for p in multi], [p.speedup for p in multi])
            if multi
            else float("nan")
        )
    else:
        amdahl = float("nan")
    s = Series(engine, kind, points, amdahl, label=engine)
    column = ALLREDUCE_S.get(engine, "hvd_s")
    # older benchmark records have no torch.distributed timing (NaN)
    samples = [
        (r["n"], r["bytes"], r[column]) for r in allreduce or [] if math.isfinite(r.get(column, math.nan))
    ]
    if points and len([x for x in samples if x[0] > 1]) >= 2 and runs:
        s.alpha_beta = fit_alpha_beta(samples)
        grad_bytes = float(runs[0].parameters * runs[0].grad_bytes_per_param)
        s.step_model = fit_step_model(
            s.alpha_beta, [(p.n, p.batch_per_rank, p.compute_s, p.comm_s) for p in points], grad_bytes
        )
        for p in points:
            p.model_step_s = s.step_model.step_s(p.n, p.batch_per_rank)
        s.predictions = predict(kind, s.step_model, points)
    return s


def analyze_runs(
    kind: str,
    runs: list[Run],
    missing: list[str],
    allreduce: list[dict[str, Any]] | None = None,
    corrupt: list[str] | None = None,
) -> Analysis:
    """One series per engine and micro-batch count, in the order they first appear among the runs."""
    keys = list(dict.fromkeys((r.engine, r.microbatches) for r in runs))
    several_m = len({m for _, m in keys}) > 1
    series = []
    for engine, m in keys:
        s = analyze_series(
            kind, [r for r in runs if (r.engine, r.microbatches) == (engine, m)], allreduce, engine
        )
        s.label = f"{engine} m={m}" if several_m else engine
        series.append(s)
    return Analysis(kind, series, missing, list(allreduce or []), list(corrupt or []))


def predict(kind: str, model: StepModel, points: list[Point]) -> list[dict[str, float]]:
    """Step time and efficiency at 2x, 4x, 8x the largest measured scale."""
    base, top = points[0], points[-1]
    global_batch = top.batch_per_rank * top.n
    out = []
    base_step = model.step_s(base.n, base.batch_per_rank)
    for factor in (2, 4, 8):
        n = top.n * factor
        b = global_batch / n if kind == "strong" else top.batch_per_rank
        step = model.step_s(n, b)
        rel = n / base.n
        eff = (
            base_step / (rel * step)
            if kind == "strong"
            else (b * n / step) / (rel * base.batch_per_rank * base.n / base_step)
        )
        out.append(
            {"n": n, "batch_per_rank": b, "step_s": step, "efficiency": eff, "throughput": b * n / step}
        )
    return out


def analyze_dir(study_dir: Path) -> Analysis:
    """Every run of the study that has a valid summary; the others are listed as missing (no
    summary: failed, cancelled, not run) or corrupt (a summary that cannot be read)."""
    manifest = records.read_study(study_dir)
    runs, missing, corrupt = [], [], []
    for entry in manifest.runs:
        try:
            runs.append(run_from_records(Path(entry.run_dir), entry.rep))
        except records.RecordMissing:
            missing.append(entry.run_dir)
        except RecordError as e:
            missing.append(entry.run_dir)
            corrupt.append(str(e))
    allreduce: list[dict[str, Any]] = []
    for path in sorted(study_dir.glob("allreduce-n*.json")):
        try:
            result = records.read(path, records.AllreduceResult)
        except RecordError as e:
            corrupt.append(str(e))
            continue
        allreduce.extend(dataclasses.asdict(row) for row in result.rows)
    return analyze_runs(manifest.kind, runs, missing, allreduce, corrupt)
