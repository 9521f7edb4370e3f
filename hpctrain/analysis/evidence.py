"""What an estimate stands on (analysis/estimate.py), read from a finished run or study: each
scale's step, its spread, the warm-up steps, the time before the first step and after the last,
and the step model that carries them to other scales."""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

from hpctrain import records
from hpctrain.analysis.analyze import aggregate, analyze_dir, scale_of
from hpctrain.analysis.estimate import Evidence, Measured
from hpctrain.analysis.model import from_probe
from hpctrain.analysis.roofline import for_run
from hpctrain.analysis.stepmodel import StepModel, fit_step_model
from hpctrain.errors import RecordError


def whole_s(run_dir: Path, s: records.RunSummary) -> float:
    """The run's wall time from its launch to its end: SLURM's accounting (every incarnation of
    the job), or the local launcher's state (started .. last update); else the training's own."""
    if s.cost_source == "sacct" and s.nodes > 0 and math.isfinite(s.node_hours):
        return s.node_hours / s.nodes * 3600
    try:
        st = records.read(run_dir / records.STATE, records.LocalState)
    except RecordError:
        return s.finished - s.started
    launched = st.started if st.started is not None else s.started
    return max(st.updated - launched, s.finished - s.started)


def measured_run(run_dir: Path) -> tuple[Measured, records.RunSummary]:
    """One finished run as a measured scale; RecordError when it has no usable summary."""
    s = records.read(run_dir / records.SUMMARY, records.RunSummary)
    steps = records.read_steps(run_dir / records.steps_file(0))
    warm = [r.step_s for r in steps if not r.timed]
    training = s.finished - s.started
    m = Measured(
        n=s.world_size,
        nodes=max(s.nodes, 1),
        batch_per_rank=s.batch_per_rank,
        threads=s.threads_per_rank,
        step_s=s.step_s,
        spread=max(s.step_p95_s / s.step_p50_s - 1, 0.0) if s.step_p50_s > 0 else 0.0,
        warm_step_s=statistics.fmean(warm) if warm else 0.0,
        setup_s=max(whole_s(run_dir, s) - training, 0.0),
        fixed_s=max(training - sum(r.step_s for r in steps), 0.0),
    )
    return m, s


def what_of(s: records.RunSummary) -> tuple[tuple[str, str], ...]:
    """What must agree between the evidence and the point it estimates."""
    return (
        ("model", s.model),
        ("precision", s.precision),
        ("parallelism.engine", s.engine),
        ("parallelism", s.parallelism),
    )


def run_model(s: records.RunSummary) -> StepModel | None:
    """A one-scale step model on the run's own probe of its collective (None: one rank, a
    layout without a probe)."""
    rf = for_run(s)
    comm = from_probe(s.world_size, s.grad_bytes, s.probe_small_s, s.probe_full_s)
    if rf is None or comm is None:
        return None
    (point,) = aggregate("strong", [s])
    return fit_step_model(comm, s.grad_bytes, rf.messages, [scale_of(point)])


def from_run(run_dir: Path) -> Evidence:
    m, s = measured_run(run_dir)
    return Evidence(str(run_dir), (m,), run_model(s), what=what_of(s))


def merged(ms: list[Measured]) -> Measured:
    """Repetitions of one scale: the means, the widest spread."""

    def mean(key: str) -> float:
        return statistics.fmean(getattr(m, key) for m in ms)

    first = ms[0]
    return Measured(
        first.n,
        first.nodes,
        first.batch_per_rank,
        first.threads,
        mean("step_s"),
        max(m.spread for m in ms),
        mean("warm_step_s"),
        mean("setup_s"),
        mean("fixed_s"),
        len(ms),
        _range(m.setup_s for m in ms) if len(ms) > 1 else first.setup_spread,
    )


def _range(values: Iterable[float]) -> float:
    """(max - min) / mean: how far apart repetitions fell."""
    xs = list(values)
    mean = statistics.fmean(xs)
    return (max(xs) - min(xs)) / mean if mean > 0 else 0.0


def from_study(study_dir: Path) -> Evidence:
    """A finished study: every scale it measured, its step model and leave-one-out band (the first
    series: a study comparing engines or layouts is named per series in the message)."""
    a = analyze_dir(study_dir)
    if not a.series or not a.points:
        raise RecordError(f"{study_dir}: no finished run to estimate from")
    series = a.series[0]
    by_n: dict[tuple[int, float], list[Measured]] = defaultdict(list)
    first: records.RunSummary | None = None
    for entry in records.read_study(study_dir).runs:
        try:
            m, s = measured_run(records.member_dir(study_dir, entry.run_dir))
        except RecordError:
            continue  # failed or unfinished: analyze lists it
        if s.engine == series.engine:
            by_n[(m.n, m.batch_per_rank)].append(m)
            first = first or s
    if first is None:
        raise RecordError(f"{study_dir}: no finished run to estimate from")
    model = series.step_model
    band = model.loo_band if model is not None and model.described else math.nan
    scales = tuple(merged(ms) for _, ms in sorted(by_n.items()))
    return Evidence(str(study_dir), scales, model, band, what_of(first))


def from_tune(tune_dir: Path) -> Evidence:
    """A tune: its best trial, the run of the settings it chose (best.yaml)."""
    t = records.read(tune_dir / records.TUNE, records.TuneManifest)
    if not t.best_trial:
        raise RecordError(f"{tune_dir}: no trial of this tune finished to estimate from")
    ev = from_run(tune_dir / t.best_trial)
    return replace(ev, source=f"{tune_dir}'s best trial ({t.best_trial})")


def evidence_from(path: Path) -> Evidence:
    """An earlier run, study or tune named as the estimate's evidence."""
    if (path / records.STUDY).exists():
        return from_study(path)
    if (path / records.TUNE).exists():
        return from_tune(path)
    if (path / records.SUMMARY).exists():
        return from_run(path)
    raise RecordError(
        f"{path}: neither a finished run (summary.json), a study (study.json) nor a tune (tune.json) "
        "to estimate from"
    )
