"""Tracking of what commands hold: one run, a sweep (one experiment, a run per point) or a study
(one experiment, a parent run with a child per point, and the study's speedup and efficiency per
scale on the parent). Used live by `hpctrain run`, at the end by `hpctrain study`, and by
`hpctrain track DIR` for a directory of any kind at any later time."""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from hpctrain import records
from hpctrain.analysis.analyze import analyze_dir
from hpctrain.errors import RecordError
from hpctrain.records import State
from hpctrain.tracking.sinks import MlflowSink
from hpctrain.tracking.sync import (
    TB_DIR,
    Guarded,
    RunSync,
    Targets,
    load_state,
    save_state,
    targets_of,
    uid_of,
)

LIVE_EVERY_S = 5.0


def members(path: Path) -> tuple[str, list[tuple[Path, list[str]]]]:
    """("run" | "sweep" | "study", [(run directory, its overrides)]); a tune's trials are a sweep's."""
    if (path / records.STUDY).exists():
        m = records.read(path / records.STUDY, records.StudyManifest)
        return "study", [(records.member_dir(path, r.run_dir), list(r.overrides)) for r in m.runs]
    if (path / records.SWEEP).exists():
        s = records.read(path / records.SWEEP, records.SweepManifest)
        return "sweep", [(records.member_dir(path, r.run_dir), list(r.overrides)) for r in s.runs]
    if (path / records.TUNE).exists():  # a tune's trials, as a sweep's points
        t = records.read(path / records.TUNE, records.TuneManifest)
        return "sweep", [(path / x.name, [*t.overrides, *x.changed]) for x in t.trials]
    if (path / records.JOB).exists() or (path / records.SUMMARY).exists():
        return "run", [(path, [])]
    raise RecordError(
        f"{path} is not a run, sweep, study or tune directory (no {records.JOB}, {records.SWEEP}, "
        f"{records.STUDY} or {records.TUNE})"
    )


def group_targets(
    path: Path, runs: list[tuple[Path, list[str]]], uri: str | None, tensorboard: bool
) -> Targets:
    """Where the group's runs go: as their config says, or where the command says (`uri`,
    `tensorboard`); `hpctrain track` of runs that tracked nothing goes to MLflow's default store."""
    first = runs[0][0] if runs else path
    group = None if (len(runs) == 1 and first == path) else path.name
    t = targets_of(first, group, uri)
    t.tensorboard = t.tensorboard or tensorboard
    return t


def track(
    path: Path,
    uri: str | None,
    tensorboard: bool,
    warn: Callable[[str], None],
    state_of: Callable[[Path], State],
) -> tuple[Targets | None, int]:
    """Send everything new of a run, sweep or study; (where it went, runs synced). None for where:
    tracking failed (warned), so nothing is there to be shown."""
    kind, runs = members(path)
    t = group_targets(path, runs, uri, tensorboard)
    if not t.any:  # the runs tracked nothing: MLflow's default store
        t = group_targets(path, runs, "default", tensorboard)
    guard = Guarded(warn, later=False)
    parent = guard(str(path), partial(_study_parent, path, t)) if kind == "study" and t.uri else None
    done = 0
    experiment_id = None
    for run_dir, overrides in runs:
        if not run_dir.exists():
            continue
        sync = RunSync(run_dir, t, run_dir.name, overrides, parent, experiment_id)
        state = state_of(run_dir)
        guard(str(path), lambda: sync.sync(final=state not in (State.PENDING, State.RUNNING), status=state))
        if guard.failed:
            break
        experiment_id = sync.experiment_id
        done += 1
    ended = all(state_of(d) not in (State.PENDING, State.RUNNING) for d, _ in runs if d.exists())
    if parent is not None and ended and not guard.failed:  # once, when every run has ended
        guard(str(path), partial(_study_metrics, path, t, parent, len(runs)))
    return (None if guard.failed else t), done


def _study_parent(path: Path, t: Targets) -> str:
    assert t.uri is not None
    sink = MlflowSink(t.uri)
    return sink.run(sink.experiment(t.experiment), uid_of(path), path.name)


def _study_metrics(path: Path, t: Targets, parent: str, runs: int) -> None:
    """Speedup and efficiency per scale (step = the scale), the report as artifacts."""
    assert t.uri is not None
    state = load_state(path)
    mine = state.setdefault("mlflow", {}).setdefault(t.uri, {})
    if mine.get("final"):
        return
    sink = MlflowSink(t.uri)
    a = analyze_dir(path)
    now = int(time.time() * 1000)
    values: list[tuple[str, float, int]] = []
    for series in a.series:
        label = f"{series.label}." if len(a.series) > 1 else ""
        for p in series.points:
            values += [
                (f"{label}samples_per_s", p.throughput, p.n),
                (f"{label}speedup", p.speedup, p.n),
                (f"{label}efficiency", p.efficiency, p.n),
                (f"{label}comm_share", p.comm_share, p.n),
            ]
    sink.metrics(parent, values, now)
    sink.params(parent, {"hpctrain.study.kind": a.kind, "hpctrain.study.runs": str(runs)})
    report = path / records.REPORT
    if report.is_dir():
        sink.artifact(parent, report)
    sink.end(parent, "FINISHED")
    mine.update(run_id=parent, final=True)
    save_state(path, state)


def logdir_hint(path: Path, kind: str) -> str:
    """The command that shows a run's (or every run's of a group) TensorBoard scalars."""
    return f"tensorboard --logdir {path / TB_DIR if kind == 'run' else path}"


class LiveTracking:
    """For the waiting command: syncs the runs it follows every few seconds, and at the end."""

    def __init__(self, path: Path, warn: Callable[[str], None], state_of: Callable[[Path], State]) -> None:
        self.path, self.warn, self.state_of = path, warn, state_of
        kind, runs = members(path)
        self.kind = kind
        self.targets = group_targets(path, runs, None, False)
        self.guard = Guarded(warn)
        self.syncs = [RunSync(d, self.targets, d.name, o) for d, o in runs]
        self.last = 0.0

    def poll(self) -> None:
        if not self.targets.any or time.monotonic() - self.last < LIVE_EVERY_S:
            return
        self.last = time.monotonic()
        for s in self.syncs:
            self.guard(str(self.path), s.sync)

    def finish(self) -> None:
        if not self.targets.any:
            return
        for s in self.syncs:
            state = self.state_of(s.run_dir)
            final = state not in (
                State.PENDING,
                State.RUNNING,
            )  # still running: `hpctrain track` ends it later
            self.guard(str(self.path), partial(s.sync, final, state))

    def where(self) -> str:
        """Where the tracking went; nothing once it stopped (the warning said so)."""
        return "" if self.guard.failed else where(self.path, self.kind, self.targets)


def where(path: Path, kind: str, t: Targets) -> str:
    """Where the tracking went, as the commands that show it."""
    out = []
    if t.uri is not None:
        out.append(f"MLflow: experiment {t.experiment!r} in {t.uri}  (mlflow ui --backend-store-uri {t.uri})")
    if t.tensorboard:
        out.append(f"TensorBoard: {logdir_hint(path, kind)}")
    return "\n".join(out)
