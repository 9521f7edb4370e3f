"""Sync run directories to the trackers, idempotently. Each run directory keeps what it has
sent where in tracking.json (its tracking uid, per MLflow store the run id and the last step
logged; for TensorBoard the last step), so a live sync, the final one and any later
`hpctrain track` add only what is new: logging twice never duplicates. A run is found again in
a store by its uid tag, also from another machine's copy of the directory."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpctrain import bounded, records
from hpctrain.config import yaml_bounds
from hpctrain.records import State
from hpctrain.tracking.sinks import MlflowSink, TensorBoardSink, default_uri, step_metrics
from hpctrain.tracking.source import params_of, step_rows, summary_metrics, world_of

TRACKING = "tracking.json"
TB_DIR = "tensorboard"
FINAL = {State.COMPLETED: "FINISHED", State.CANCELLED: "KILLED"}  # MLflow's words; any other end: FAILED


@dataclass
class Targets:
    """Where to track: an MLflow store (None: not MLflow), TensorBoard, and the experiment."""

    uri: str | None
    tensorboard: bool
    experiment: str

    @property
    def any(self) -> bool:
        return self.uri is not None or self.tensorboard


def targets_of(run_dir: Path, group: str | None = None, uri: str | None = None) -> Targets:
    """From the run's config.yaml (tracking.*); `uri` sends it to that MLflow store. A run that
    tracked nothing goes to MLflow's default store when sent with `hpctrain track`
    (`uri` = "default"). The experiment: tracking.experiment, else the group's (a sweep's or
    study's directory name), else run.name."""
    try:
        cfg = yaml_bounds.load(run_dir / records.CONFIG, bounded.TEXT) or {}  # a bomb: BadYaml
    except ValueError:
        cfg = {}
    cfg = cfg if isinstance(cfg, dict) else {}
    t, run = cfg.get("tracking") or {}, cfg.get("run") or {}
    default = default_uri(Path(run.get("output_root") or "outputs"))
    if uri == "default":
        uri = t.get("uri") or default
    mlflow_uri = uri or ((t.get("uri") or default) if t.get("mlflow") else None)
    name = t.get("experiment") or group or run.get("name") or "hpctrain"
    return Targets(mlflow_uri, bool(t.get("tensorboard")), str(name))


def load_state(run_dir: Path) -> dict[str, Any]:
    try:
        data = json.loads(bounded.read_bytes(run_dir / TRACKING, bounded.RECORD))
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError, RecursionError):
        return {}


def save_state(run_dir: Path, state: dict[str, Any]) -> None:
    records.write_atomic(run_dir / TRACKING, json.dumps(state, indent=1).encode())


def uid_of(run_dir: Path) -> str:
    state = load_state(run_dir)
    if "uid" not in state:
        state["uid"] = uuid.uuid4().hex
        save_state(run_dir, state)
    return str(state["uid"])


@dataclass
class RunSync:
    """One run directory's tracking: sync() sends what is new; final=True also the summary,
    the artifacts and the end status."""

    run_dir: Path
    targets: Targets
    name: str
    overrides: list[str] = field(default_factory=list)
    parent: str | None = None  # the study's MLflow run
    experiment_id: str | None = None
    _mlflow: MlflowSink | None = None

    def sync(self, final: bool = False, status: State = State.COMPLETED) -> None:
        state = load_state(self.run_dir)
        state.setdefault("uid", uuid.uuid4().hex)
        world = world_of(self.run_dir)
        if self.targets.uri is not None:
            self._sync_mlflow(state, world, final, status)
        if self.targets.tensorboard:
            self._sync_tensorboard(state, world, final)
        save_state(self.run_dir, state)

    def mlflow(self) -> MlflowSink:
        if self._mlflow is None:
            assert self.targets.uri is not None
            self._mlflow = MlflowSink(self.targets.uri)
        return self._mlflow

    def _sync_mlflow(self, state: dict[str, Any], world: int, final: bool, status: State) -> None:
        sink, uri = self.mlflow(), str(self.targets.uri)
        mine = state.setdefault("mlflow", {}).setdefault(uri, {"step": -1})
        if self.experiment_id is None:
            self.experiment_id = sink.experiment(self.targets.experiment)
        run_id = mine.get("run_id") or sink.run(self.experiment_id, state["uid"], self.name, self.parent)
        mine["run_id"] = run_id
        if not mine.get("params"):
            sink.params(run_id, params_of(self.run_dir, self.overrides))
            mine["params"] = True
        rows = step_rows(self.run_dir, world, mine["step"])
        now = int(time.time() * 1000)
        sink.metrics(run_id, step_metrics(rows), now)
        if rows:
            mine["step"] = rows[-1].step
        if final and not mine.get("final"):
            last = max(mine["step"], 0)
            sink.metrics(
                run_id, [(f"summary.{k}", v, last) for k, v in summary_metrics(self.run_dir).items()], now
            )
            for name in (records.CONFIG, records.SUMMARY, records.COST):
                sink.artifact(run_id, self.run_dir / name)
            if (self.run_dir / records.REPORT).is_dir():
                sink.artifact(run_id, self.run_dir / records.REPORT)
            sink.end(run_id, FINAL.get(status, "FAILED"))
            mine["final"] = True

    def _sync_tensorboard(self, state: dict[str, Any], world: int, final: bool) -> None:
        logdir = self.run_dir / TB_DIR
        mine = state.setdefault("tensorboard", {"step": -1})
        if not any(logdir.glob("events.out.tfevents.*")):
            mine.clear()
            mine["step"] = -1  # the event files were removed: write them again
        rows = step_rows(self.run_dir, world, mine["step"])
        if not rows and not (final and not mine.get("final")):
            return
        sink = TensorBoardSink(logdir)
        try:
            sink.steps(rows)
            if rows:
                mine["step"] = rows[-1].step
            if final and not mine.get("final"):
                sink.summary(summary_metrics(self.run_dir), max(mine["step"], 0))
                mine["final"] = True
        finally:
            sink.close()


class Guarded:
    """Calls a sync; on its first failure warns once and stops trying (tracking never fails a
    run: the records stay, and `hpctrain track DIR` sends them later)."""

    def __init__(self, warn: Callable[[str], None], later: bool = True) -> None:
        self.warn = warn
        self.later = later  # say how to send them later (not to `hpctrain track` itself)
        self.failed = False

    def __call__(self, what: str, fn: Callable[[], Any]) -> Any:
        if self.failed:
            return None
        try:
            return fn()
        except Exception as e:  # noqa: BLE001 - any tracker failure: a warning, never the run's failure
            self.failed = True
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            later = f": send them later with `hpctrain track {what}`" if self.later else " as they were"
            self.warn(f"tracking stopped ({type(e).__name__}: {first[:300]}); the records are kept{later}")
            return None
