"""The two trackers hpctrain writes to, each imported only when used: MLflow (a client of any
store: the default SQLite file, or a server) and TensorBoard (event files)."""

from __future__ import annotations

import fcntl
import os
import sqlite3
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

from hpctrain.errors import HpctrainError
from hpctrain.tracking.source import StepRow

# a live sync must not hang the waiting command on a server that is down: fail fast, warn, go on
os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")

UID_TAG = "hpctrain.uid"


def default_uri(output_root: Path) -> str:
    return f"sqlite:///{output_root.resolve() / 'mlflow.db'}"


def local_db(uri: str) -> Path | None:
    return Path(uri.removeprefix("sqlite:///")) if uri.startswith("sqlite:///") else None


@contextmanager
def _store_lock(uri: str) -> Iterator[None]:
    """Experiments and runs are looked up then created: one writer at a time per local store
    (mlflow#4123: concurrent jobs created the same experiment twice). A server serializes itself."""
    db = local_db(uri)
    if db is None:
        yield
        return
    db.parent.mkdir(parents=True, exist_ok=True)
    with open(db.with_name(db.name + ".lock"), "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def writable(db: Path) -> None:
    """A local store's file can be written, checked in well under a second: MLflow itself
    retries an engine it cannot open for about 100 s (mlflow.store.db.utils, 10 tries)."""
    try:
        db.parent.mkdir(parents=True, exist_ok=True)
        with closing(sqlite3.connect(db, timeout=5)) as c:
            c.execute("BEGIN IMMEDIATE")  # takes the write lock: fails on a read-only file or mount
            c.rollback()
    except (OSError, sqlite3.Error) as e:
        raise StoreError(f"the MLflow store {db} cannot be written: {e}") from e


class StoreError(HpctrainError):
    """An MLflow store that cannot be used (a read-only or missing place)."""


class MlflowSink:
    def __init__(self, uri: str) -> None:
        import logging

        from mlflow.tracking import MlflowClient

        logging.getLogger("mlflow").setLevel(logging.WARNING)  # no "creating tables" chatter
        self.uri = uri
        db = local_db(uri)
        if db is not None:
            writable(db)
        with _store_lock(uri):  # a new store's tables are created by one process at a time
            self.client = MlflowClient(tracking_uri=uri)
            self.client.search_experiments(max_results=1)  # creates (or migrates) the store now

    def experiment(self, name: str) -> str:
        from mlflow.exceptions import MlflowException

        with _store_lock(self.uri):
            found = self.client.get_experiment_by_name(name)
            if found is not None:
                return str(found.experiment_id)
            db = local_db(self.uri)
            where = str(db.parent / "mlartifacts" / name.replace("/", "_")) if db else None
            try:
                return str(self.client.create_experiment(name, artifact_location=where))
            except MlflowException:  # created by another writer meanwhile (a server)
                again = self.client.get_experiment_by_name(name)
                if again is None:
                    raise
                return str(again.experiment_id)

    def run(self, experiment_id: str, uid: str, name: str, parent: str | None = None) -> str:
        """The tracking run of this uid: found again (never a second one), or created."""
        with _store_lock(self.uri):
            found = self.client.search_runs([experiment_id], f"tags.`{UID_TAG}` = '{uid}'", max_results=1)
            if found:
                return str(found[0].info.run_id)
            tags = {UID_TAG: uid, "mlflow.runName": name}
            if parent:
                tags["mlflow.parentRunId"] = parent
            return str(self.client.create_run(experiment_id, tags=tags).info.run_id)

    def params(self, run_id: str, params: dict[str, str]) -> None:
        from mlflow.entities import Param

        items = [Param(k, v) for k, v in sorted(params.items())]
        for i in range(0, len(items), 100):  # MLflow takes at most 100 parameters per batch
            self.client.log_batch(run_id, params=items[i : i + 100])

    def metrics(self, run_id: str, values: list[tuple[str, float, int]], timestamp_ms: int) -> None:
        from mlflow.entities import Metric

        items = [Metric(k, float(v), timestamp_ms, step) for k, v, step in values if v == v]
        for i in range(0, len(items), 1000):
            self.client.log_batch(run_id, metrics=items[i : i + 1000])

    def artifact(self, run_id: str, path: Path) -> None:
        if path.is_dir():
            self.client.log_artifacts(run_id, str(path), artifact_path=path.name)
        elif path.is_file():
            self.client.log_artifact(run_id, str(path))

    def end(self, run_id: str, status: str) -> None:
        self.client.set_terminated(run_id, status)


def step_metrics(rows: list[StepRow]) -> list[tuple[str, float, int]]:
    out: list[tuple[str, float, int]] = []
    for row in rows:
        out += [("loss", row.loss, row.step), ("samples_per_s", row.samples_per_s, row.step)]
        phases = list(row.per_rank.values())
        for phase in ("compute", "comm", "data", "wait"):
            mean = sum(p[phase] for p in phases) / len(phases)
            out.append((f"{phase}_ms", 1e3 * mean, row.step))  # mean over the ranks
    return out


class TensorBoardSink:
    """One writer for the run (never one per rank): <run dir>/tensorboard, a tag per rank."""

    def __init__(self, logdir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer: Any = SummaryWriter(log_dir=str(logdir))

    def steps(self, rows: list[StepRow]) -> None:
        for row in rows:
            self.writer.add_scalar("loss", row.loss, row.step)
            self.writer.add_scalar("samples_per_s", row.samples_per_s, row.step)
            for rank, phases in row.per_rank.items():
                for phase, seconds in phases.items():
                    self.writer.add_scalar(f"{phase}_ms/rank{rank}", 1e3 * seconds, row.step)

    def summary(self, values: dict[str, float], step: int) -> None:
        for key, v in values.items():
            self.writer.add_scalar(f"summary/{key}", v, step)

    def close(self) -> None:
        self.writer.close()
