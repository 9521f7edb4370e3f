"""Collect a study's run directories and compute its scaling figures. Reading is tolerant:
failed or missing runs are listed, never fatal."""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from hpctrain import records
from hpctrain.analysis import metrics
from hpctrain.analysis.model import CommModel, fit_comm_model
from hpctrain.analysis.roofline import Roofline, roofline
from hpctrain.analysis.stepmodel import Scale, StepModel, fit_step_model
from hpctrain.analysis.study_parts import StudyPart, series_key, study_parts
from hpctrain.analysis.summaries import summaries
from hpctrain.analysis.uncertainty import Interval, positive_interval, ratio_interval
from hpctrain.errors import RecordError
from hpctrain.records.parts import share

NO_INTERVAL = Interval(float("nan"), float("nan"), "none (one run)")


@dataclass
class Point:
    n: int
    reps: int
    throughput: float
    throughput_ci: Interval
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
    peak_by_stage: tuple[float, ...] = ()  # bytes, mean over repetitions
    speedup_ci: Interval = NO_INTERVAL
    efficiency_ci: Interval = NO_INTERVAL
    threads: int = 0
    # what each part of the runs adds to the point (analysis/study_parts.py), by its key: a
    # pipeline's bubble, transfers and overhead; and the idle time they sum to, which the step
    # model carries over from scale to scale
    parts: dict[str, dict[str, float]] = field(default_factory=dict)
    idle_s: float = 0.0
    loo_step_s: float = float("nan")  # predicted from the other scales (leave-one-out)
    roofline: Roofline | None = None
    comm_reps: tuple[float, ...] = ()  # exposed communication of each repetition
    throughput_reps: tuple[float, ...] = ()
    imbalance_s: float = float("nan")  # of comm_s, the wait for the slowest rank (NaN: not measured)
    wait_reps: tuple[float, ...] = ()
    # parameters + gradients + optimizer state of the rank holding most, mean over repetitions
    # (bytes; NaN: not recorded): what sharding divides by the shard degree
    state_bytes: float = float("nan")
    node_hours: float = float("nan")  # per run: allocation x training time, or sacct's (mean over reps)
    node_hours_per_1k: float = float("nan")  # steady state: nodes x step time per 1,000 samples
    mfu: float = float("nan")  # model FLOPs utilisation (analysis/peak.py), mean over reps; NaN: unknown
    peak_source: str = ""  # what the MFU is against (the first repetition's peak)


@dataclass(frozen=True)
class Prediction:
    n: int
    batch_per_rank: float
    step_s: float
    throughput: float
    efficiency: float
    band: float  # relative: the truth is expected within step x / (1 + band) .. x (1 + band)
    mfu: float = float("nan")  # at the predicted throughput (NaN: the study measured none)

    def throughput_range(self) -> tuple[float, float]:
        """Throughput at the band's edges (log-symmetric, so never below zero)."""
        return self.throughput / (1 + self.band), self.throughput * (1 + self.band)


@dataclass
class Series:
    """One engine's points and the fits made from them."""

    engine: str
    kind: str  # strong | weak
    points: list[Point]
    amdahl_serial_fraction: float  # NaN when the runs show no speedup to fit
    amdahl_se: float = float("nan")  # its standard error (NaN: no spare degree of freedom)
    collective: str = "hvd_s"  # the allreduce benchmark's column that times the engine's collective
    comm: CommModel | None = None
    step_model: StepModel | None = None
    predictions: list[Prediction] = field(default_factory=list)
    label: str = ""  # how tables and plots name it: the engine, and the micro-batches if they vary

    @property
    def no_speedup(self) -> bool:
        """Amdahl's law cannot describe runs that got slower with more ranks or with a serial
        fraction outside [0, 1]."""
        multi = [p for p in self.points if p.n > self.points[0].n] if self.points else []
        s = self.amdahl_serial_fraction
        return bool(multi) and (not 0 <= s < 1 or any(p.speedup < 1 for p in multi))


@dataclass
class Analysis:
    """A study: one series per parallelism, engine and micro-batch count (one unless
    study.parallelisms, study.engines or study.microbatches compares them)."""

    kind: str  # strong | weak
    series: list[Series]
    missing: list[str]  # run directories without a summary (failed, cancelled, not run)
    allreduce: list[records.AllreduceRow] = field(default_factory=list)  # bench rows, all world sizes
    corrupt: list[str] = field(default_factory=list)  # "<file>: what is wrong", for unreadable records
    containers: list[str] = field(default_factory=list)  # the images the runs' ranks ran in
    # the study views of the parts its runs hold (analysis/study_parts.py), and each one's section
    parts: dict[str, StudyPart] = field(default_factory=dict)
    part_lines: list[tuple[StudyPart, list[str]]] = field(default_factory=list)
    placement: list[str] = field(default_factory=list)  # points whose repetitions ran on different nodes

    @property
    def points(self) -> list[Point]:
        return [p for s in self.series for p in s.points]

    @property
    def compares(self) -> bool:
        return len(self.series) > 1


def interval_note(a: Analysis) -> str:
    """Which intervals the tables and plots show: t-based ones need 3 repetitions."""
    return "ranges: " + "; ".join(sorted({p.throughput_ci.method for p in a.points}))


def run_from_records(run_dir: Path) -> records.RunSummary:
    """A study's run: its summary.json; RecordMissing/RecordError if it has none or a bad one."""
    return records.read(run_dir / records.SUMMARY, records.RunSummary)


def degenerate(run: records.RunSummary) -> str | None:
    """Why a readable summary cannot be a point of the analysis (every figure divides by these)."""
    for key in ("throughput_samples_per_s", "step_s", "throughput_per_rank"):
        value = getattr(run, key)
        if not (math.isfinite(value) and value > 0):
            return f"{key} is {value!r}, not a finite positive number"
    if run.world_size < 1:
        return f"world_size is {run.world_size}, not a positive count"
    return None


def aggregate(kind: str, runs: list[records.RunSummary]) -> list[Point]:
    views = study_parts(runs)
    by_n: dict[int, list[records.RunSummary]] = defaultdict(list)
    for r in runs:
        by_n[r.world_size].append(r)
    points = []
    for n in sorted(by_n):
        rs = by_n[n]
        values = [r.throughput_samples_per_s for r in rs]
        avg = lambda k: statistics.fmean(getattr(r, k) for r in rs)  # noqa: E731
        p = Point(
            n,
            len(rs),
            statistics.fmean(values),
            positive_interval(values),
            avg("step_s"),
            avg("compute_s"),
            avg("comm_s"),
            avg("data_s"),
            avg("batch_per_rank"),
        )
        p.comm_share, p.data_share = share(p.comm_s, p.step_s), share(p.data_s, p.step_s)
        p.threads = rs[0].threads_per_rank
        p.comm_reps, p.throughput_reps = tuple(r.comm_s for r in rs), tuple(values)
        p.imbalance_s, p.wait_reps = avg("imbalance_s"), tuple(r.imbalance_s for r in rs)
        for key, view in views.items():
            p.parts[key] = view.figures(rs, p.step_s)
            p.idle_s += p.parts[key].get(view.idle, 0.0) if view.idle else 0.0
        if all(math.isfinite(r.node_hours) for r in rs):
            p.node_hours = avg("node_hours")
        if all(r.nodes for r in rs):  # node-hours per 1,000 samples: nodes x seconds per sample
            p.node_hours_per_1k = (
                statistics.fmean(r.nodes * r.step_s / r.global_batch for r in rs) * 1e3 / 3600
            )
        mfus = [r.mfu for r in rs]
        if all(m is not None for m in mfus):
            p.mfu = statistics.fmean(m for m in mfus if m is not None)
            p.peak_source = rs[0].peak_source
        held = [max(x.state_bytes for x in r.per_rank) for r in rs if r.per_rank]
        if held and all(held):
            p.state_bytes = statistics.fmean(held)
        if all(len(r.peak_by_stage) == len(rs[0].peak_by_stage) for r in rs):
            p.peak_by_stage = tuple(statistics.fmean(col) for col in zip(*(r.peak_by_stage for r in rs)))
        points.append(p)
    if not points:
        return points
    base = points[0]  # the smallest measured scale is the reference (normally N = 1)
    for p in points:
        rel = p.n / base.n
        p.speedup = metrics.speedup(p.throughput, base.throughput)
        p.efficiency = metrics.efficiency(p.throughput, base.throughput, rel)
        p.karp_flatt = metrics.karp_flatt(p.speedup, rel) if kind == "strong" else float("nan")
        if p is not base:  # efficiency = speedup / relative scale, in both kinds (throughput form)
            p.speedup_ci = ratio_interval(p.throughput, p.throughput_ci, base.throughput, base.throughput_ci)
            p.efficiency_ci = p.speedup_ci.scaled(1 / rel)
    return points


def analyze_series(
    kind: str, runs: list[records.RunSummary], allreduce: Sequence[records.AllreduceRow] = ()
) -> Series:
    """The figures of one engine's runs; `allreduce`: benchmark rows for the alpha-beta fit of the
    collective the engine recorded that it uses."""
    points = aggregate(kind, runs)
    multi = [p for p in points if p.n > points[0].n] if points else []
    amdahl, amdahl_se = float("nan"), float("nan")
    if kind == "strong" and multi:
        # every repetition's speedup over the smallest scale's mean: the scatter gives the error
        base = points[0].throughput
        ns = [p.n / points[0].n for p in multi for _ in p.throughput_reps]
        ups = [x / base for p in multi for x in p.throughput_reps]
        amdahl, amdahl_se = metrics.amdahl_with_se(ns, ups)
    first = runs[0]
    s = Series(first.engine, kind, points, amdahl, amdahl_se, first.collective_column, label=first.engine)
    s.comm = fit_comm_model(allreduce, s.collective) if points else None
    if s.comm is None:
        return s
    scales = [scale_of(p) for p in points]
    for p, sc in zip(points, scales):
        p.roofline = roofline(
            first.engine,
            first.grouping,
            p.n,
            first.grad_bytes,
            first.grad_bucket_bytes,
            first.grad_tensors,
            s.comm,
            sc.comm_s,
            first.compression,
            sc.wait_s,
        )
    k = next((p.roofline.messages for p in points if p.roofline), 1)
    s.step_model = fit_step_model(s.comm, first.grad_bytes, k, scales)
    for p, check in zip(points, s.step_model.checks):
        p.model_step_s = check.in_sample.step_s
        p.loo_step_s = check.held_out.step_s if check.held_out else float("nan")
    if s.step_model.described:
        s.predictions = predict(kind, s.step_model, points)
    return s


def scale_of(p: Point) -> Scale:
    """The point as the step model sees it: the wait for the slowest rank, where measured, taken
    out of the exposed communication (it is load imbalance, not transfer)."""
    other = p.step_s - p.compute_s - p.comm_s - p.idle_s  # data wait and anything unnamed
    comm, reps, wait = p.comm_s, p.comm_reps, 0.0
    if math.isfinite(p.imbalance_s):
        wait = p.imbalance_s
        comm = max(p.comm_s - wait, 0.0)
        reps = tuple(max(c - w, 0.0) for c, w in zip(p.comm_reps, p.wait_reps))
    return Scale(p.n, p.batch_per_rank, p.threads, p.compute_s, comm, other, p.idle_s, p.step_s, reps, wait)


def analyze_runs(
    kind: str,
    runs: list[records.RunSummary],
    missing: list[str],
    allreduce: Sequence[records.AllreduceRow] = (),
    corrupt: list[str] | None = None,
) -> Analysis:
    """One series per layout (the parallelism and what each part adds: the stages of sharded
    ones, the tensor-parallel degree), engine and variant (the micro-batch count), in the order
    they first appear (analysis/study_parts.py: series_key). A plain pipeline's stages grow with
    the scale: one series."""
    keyed = [(series_key(r), r) for r in runs]  # once per run: each asks every part's view
    keys = list(dict.fromkeys(k for k, _ in keyed))
    several_v = len({v for _, _, v in keys}) > 1
    several_p = len({p for p, _, _ in keys}) > 1
    series, places = [], []
    for par, engine, variant in keys:
        mine = [r for k, r in keyed if k == (par, engine, variant)]
        s = analyze_series(kind, mine, allreduce)
        s.label = (f"{par} " if several_p else "") + (f"{engine} {variant}" if several_v else engine)
        series.append(s)
        places += placement_lines(s.label if len(keys) > 1 else "", mine)
    a = Analysis(kind, series, missing, list(allreduce or []), list(corrupt or []))
    a.parts = study_parts(runs)
    a.part_lines = [(view, view.lines(runs)) for view in a.parts.values() if view.section]
    a.placement = places
    return a


def placement_lines(label: str, runs: list[records.RunSummary]) -> list[str]:
    """The points whose repetitions ran on different sets of nodes: their speedups mix the
    nodes' and the links' differences with the scaling (runs recorded without their hosts, as
    before hosts were recorded, are left out)."""
    by_n: dict[int, list[tuple[str, ...]]] = defaultdict(list)
    for r in runs:
        if r.hosts:
            by_n[r.world_size].append(tuple(r.hosts))
    out = []
    for n, sets in sorted(by_n.items()):
        counts = {hosts: sets.count(hosts) for hosts in dict.fromkeys(sets)}
        if len(counts) > 1:
            shown = "; ".join(f"{','.join(h)} ({c} run(s))" for h, c in counts.items())
            out.append(
                f"{label + ' ' if label else ''}N={n}: its {len(sets)} repetitions ran on {len(counts)} node sets: {shown}"
            )
    return out


def allocation_lines(allocations: list[str], runs: list[records.RunSummary]) -> list[str]:
    """study.one_allocation: the allocation(s) every point ran in as a job step, and their nodes."""
    if not allocations:
        return []
    hosts = sorted({h for r in runs for h in r.hosts})
    switches = sorted({s for r in runs for s in r.switches})
    on = f"on {len(hosts)} node(s): {', '.join(hosts)}" if hosts else "(nodes not recorded)"
    on += f" under switch(es) {', '.join(switches)}" if switches else ""
    if len(allocations) == 1:
        return [f"every point ran as a job step of one allocation (job {allocations[0]}) {on}"]
    return [
        f"the points ran as job steps of {len(allocations)} allocations (jobs {', '.join(allocations)}: the "
        f"study was resumed in a new one) {on}"
    ]


def predict(kind: str, model: StepModel, points: list[Point]) -> list[Prediction]:
    """Step time and efficiency (against the measured smallest scale) at 2x, 4x, 8x the largest
    measured scale, banded by the largest leave-one-out error."""
    base, top = points[0], points[-1]
    global_batch = top.batch_per_rank * top.n
    base_x = base.batch_per_rank * base.n / base.step_s  # measured, as the efficiency column
    # MFU is FLOPs per sample x samples/s per rank / peak: at the same model and devices it moves
    # with the throughput per rank, from the largest measured scale's
    top_per_rank = top.batch_per_rank / top.step_s
    out = []
    for factor in (2, 4, 8):
        n = top.n * factor
        b = global_batch / n if kind == "strong" else top.batch_per_rank
        step = model.estimate(n, b, top.threads).step_s
        x = b * n / step
        mfu = top.mfu * (x / n) / top_per_rank
        out.append(Prediction(n, b, step, x, x / (n / base.n * base_x), model.loo_band, mfu))
    return out


def analyze_dir(study_dir: Path) -> Analysis:
    """Every run of the study that has a valid summary; the others are listed as missing (no
    summary: failed, cancelled, not run) or corrupt (a summary that cannot be read). Summaries
    come through the study's compact cache (analysis/summaries.py), never stale."""
    manifest = records.read_study(study_dir)
    names = [(e.run_dir, records.member_dir(study_dir, e.run_dir)) for e in manifest.runs]
    found, missing, corrupt, lines = summaries(study_dir, names)
    runs, where = [], dict(names)
    for name, run in found:
        why = degenerate(run)
        if why:
            missing.append(name)
            corrupt.append(f"{where[name] / records.SUMMARY}: {why}; the run is left out")
        else:
            runs.append(run)
    order = {name: i for i, (name, _) in enumerate(names)}
    missing.sort(key=lambda name: order.get(name, 0))
    allreduce: list[records.AllreduceRow] = []
    for path in sorted(study_dir.glob("allreduce-n*.json")):
        try:
            result = records.read(path, records.AllreduceResult)
        except RecordError as e:
            corrupt.append(str(e))
            continue
        allreduce.extend(result.rows)
    a = analyze_runs(manifest.kind, runs, missing, allreduce, corrupt)
    a.placement = allocation_lines(manifest.allocations, runs) + a.placement
    a.containers = counted(lines)
    return a


def counted(lines: list[str]) -> list[str]:
    seen: dict[str, int] = {}
    for line in lines:
        seen[line] = seen.get(line, 0) + 1
    return [f"{line}: {n} run(s)" for line, n in seen.items()]
