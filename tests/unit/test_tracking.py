"""Experiment tracking against the real MLflow client (a SQLite store) and TensorBoard's own event
reader, on run directories written here as the ranks write them: one tracking run per run
whatever the world size, live syncs that add only what is new, `track` twice without duplicates,
a study as a parent with one child per point, and a tracker that fails warns and loses nothing."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from hpctrain import records
from hpctrain.config import load_config, to_yaml
from hpctrain.records import StepRecord
from hpctrain.tracking.groups import LiveTracking, track

STUDY = Path(__file__).parents[1] / "fixtures" / "studies" / "local-strong"
RANKS = 4


def completed(_: Path) -> str:
    return "COMPLETED"


def write_steps(run_dir: Path, steps: range) -> None:
    for rank in range(RANKS):
        with open(run_dir / records.steps_file(rank), "a") as f:
            for s in steps:  # rank 3 is the slowest: 4 ms of compute against 1 ms
                compute = 0.004 if rank == 3 else 0.001
                f.write(
                    records.step_line(
                        StepRecord(
                            s, rank, 2.0 - s / 10, 0.1, 0.0005, compute, 0.002, 0.01, 16, 6400.0, s >= 1
                        )
                    )
                )


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    d = tmp_path / "run"
    d.mkdir()
    cfg = load_config(["tracking=both", f"cluster.ranks={RANKS}", f"run.output_root={tmp_path / 'out'}"])
    (d / records.CONFIG).write_text(to_yaml(cfg))
    (d / records.PLAN).write_text(json.dumps({"world_size": RANKS, "nodes": 1, "launcher": "local"}))
    shutil.copy(STUDY / "n2-r0" / records.SUMMARY, d / records.SUMMARY)
    return d


def mlflow_runs(uri: str) -> list:
    c = MlflowClient(uri)
    return c.search_runs([e.experiment_id for e in c.search_experiments()])


def test_a_four_rank_run_is_one_mlflow_run_and_one_tensorboard_writer(run_dir: Path, tmp_path: Path) -> None:
    write_steps(run_dir, range(0, 3))
    live = LiveTracking(run_dir, pytest.fail, lambda _: "RUNNING")
    live.last = -1e9
    live.poll()  # live: steps 0-2
    write_steps(run_dir, range(3, 6))
    live.finish()  # still RUNNING: not final yet
    warnings: list[str] = []
    track(run_dir, None, False, warnings.append, completed)  # later, from a login node
    track(run_dir, None, False, warnings.append, completed)  # twice: nothing new
    assert not warnings
    uri = f"sqlite:///{tmp_path / 'out' / 'mlflow.db'}"
    (run,) = mlflow_runs(uri)  # one run, not one per rank
    c = MlflowClient(uri)
    assert run.info.status == "FINISHED" and run.info.run_name == "run"
    assert [m.step for m in c.get_metric_history(run.info.run_id, "loss")] == list(range(6))
    (wait,) = {m.value for m in c.get_metric_history(run.info.run_id, "wait_ms")}
    assert wait == pytest.approx((3 * 3.0 + 0) / RANKS)  # ranks 0-2 wait 3 ms for rank 3
    assert run.data.params["hpctrain.world_size"] == "4" and run.data.params["cluster.ranks"] == "4"
    assert run.data.metrics["summary.samples_per_s"] > 0
    assert {a.path for a in c.list_artifacts(run.info.run_id)} == {records.CONFIG, records.SUMMARY}
    ea = EventAccumulator(str(run_dir / "tensorboard"))
    ea.Reload()
    assert [e.step for e in ea.Scalars("compute_ms/rank3")] == list(range(6))  # each step once
    assert ea.Scalars("compute_ms/rank3")[0].value == pytest.approx(4.0)
    assert {t for t in ea.Tags()["scalars"] if t.startswith("wait_ms/")} == {
        f"wait_ms/rank{r}" for r in range(RANKS)
    }


def test_a_copy_sent_to_another_store_is_one_more_run_there(run_dir: Path, tmp_path: Path) -> None:
    write_steps(run_dir, range(4))
    other = f"sqlite:///{tmp_path / 'elsewhere.db'}"
    for _ in range(2):
        track(run_dir, other, False, pytest.fail, completed)
    (run,) = mlflow_runs(other)
    assert len(MlflowClient(other).get_metric_history(run.info.run_id, "loss")) == 4


def test_a_study_is_a_parent_run_with_a_child_per_point(tmp_path: Path) -> None:
    study = tmp_path / "strong"
    shutil.copytree(STUDY, study)
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    for _ in range(2):
        t, n = track(study, uri, False, pytest.fail, completed)
        assert n == 6 and t.experiment == "strong"
    runs = mlflow_runs(uri)
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert len(parents) == 1 and len(runs) == 7
    assert {r.data.tags["mlflow.parentRunId"] for r in runs if r not in parents} == {parents[0].info.run_id}
    eff = MlflowClient(uri).get_metric_history(parents[0].info.run_id, "efficiency")
    assert [m.step for m in eff] == [1, 2] and eff[0].value == pytest.approx(1.0)


@pytest.mark.parametrize("store", ["server down", "unwritable"])
def test_a_tracker_that_fails_warns_once_and_keeps_the_records(
    run_dir: Path, tmp_path: Path, store: str
) -> None:
    write_steps(run_dir, range(3))
    (tmp_path / "a-file").write_text("")
    uri = "http://127.0.0.1:9" if store == "server down" else f"sqlite:///{tmp_path / 'a-file' / 'm.db'}"
    warnings: list[str] = []
    t, n = track(run_dir, uri, False, warnings.append, completed)  # nothing listens / no such directory
    assert n == 0 and len(warnings) == 1 and t is None  # nothing to point at
    assert "tracking stopped" in warnings[0] and warnings[0].endswith("the records are kept as they were")
    assert len(records.read_steps(run_dir / records.steps_file(0))) == 3


def test_a_read_only_store_stops_tracking_at_once_with_one_warning(
    run_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Before, MLflow retried opening the store 10 times (about 100 s) while the command waited."""
    import os
    import subprocess

    ro = tmp_path / "ro"
    ro.mkdir()
    root = os.geteuid() == 0  # root writes through permissions: a read-only mount for it
    if root:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(ro)], check=True)
    else:
        ro.chmod(0o555)
    try:
        warnings: list[str] = []
        t, n = track(run_dir, f"sqlite:///{ro / 'new.db'}", False, warnings.append, completed)
    finally:
        if root:
            subprocess.run(["umount", "--lazy", str(ro)], check=True)
        ro.chmod(0o755)
    assert (t, n) == (None, 0)
    [w] = warnings
    assert f"StoreError: the MLflow store {ro / 'new.db'} cannot be written" in w, w
    assert "will be retried" not in caplog.text  # MLflow's retry loop was never entered


@pytest.mark.mpi  # starts three hpctrain processes (about 25 s on 2 cores): not the quick tier
def test_trackers_creating_one_new_store_at_once_all_record(run_dir: Path, tmp_path: Path) -> None:
    """Three `hpctrain track` processes into a store none has created: before, one failed with
    'table ... already exists' or 'duplicate column' (both ran MLflow's table creation)."""
    import subprocess
    import sys

    write_steps(run_dir, range(2))
    copies = []
    for i in range(3):
        copies.append(tmp_path / f"copy{i}")
        shutil.copytree(run_dir, copies[-1])
    uri = f"sqlite:///{tmp_path / 'new.db'}"
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "hpctrain.cli", "track", "--uri", uri, str(c)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for c in copies
    ]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0] * 3, outs
    assert len(mlflow_runs(uri)) == 3


def test_a_group_goes_to_the_experiment_its_config_names(tmp_path: Path) -> None:
    """tracking.experiment names the experiment of a sweep or study too; else the group's name."""
    import yaml

    from hpctrain.tracking.groups import group_targets, members

    study = tmp_path / "strong"
    shutil.copytree(STUDY, study)
    _, runs = members(study)
    assert group_targets(study, runs, "sqlite:///x.db", False).experiment == "strong"
    cfg = load_config(["tracking=mlflow", "tracking.experiment=shared"])
    (runs[0][0] / records.CONFIG).write_text(to_yaml(cfg))
    assert yaml.safe_load((runs[0][0] / records.CONFIG).read_text())["tracking"]["experiment"] == "shared"
    assert group_targets(study, runs, "sqlite:///x.db", False).experiment == "shared"


@pytest.mark.parametrize("uri", ["sqlite:///x\ny", "sqlite:///x y", "sqlite:///x\n", "mlflow.db"])
def test_a_store_uri_with_whitespace_or_no_scheme_is_refused_before_anything_is_created(
    run_dir: Path, tmp_path: Path, uri: str
) -> None:
    """Before, `track --uri $'sqlite:///x\\ny'` created a file named 'x\\ny'."""
    from tests.conftest import hpctrain_here

    r = hpctrain_here("track", "--uri", uri, str(run_dir))
    assert r.returncode == 2 and "--uri: must be a URI such as sqlite:///abs/path/mlflow.db" in r.stderr, r
    assert not list(Path("/work").glob("x*")) and not (run_dir / "tracking.json").exists()
    from hpctrain.config.validate import config_problems

    cfg = load_config(["tracking=mlflow"])
    cfg.tracking.uri = uri  # the config's tracking.uri follows the same rule
    assert "tracking.uri" in [p.key for p in config_problems(cfg, None)]


def test_the_versions_a_run_ran_under_are_its_parameters(tmp_path: Path) -> None:
    """torch, Horovod, Python and, for a SLURM job, the SLURM its nodes ran, from env.json; a
    local run has no SLURM parameter rather than an empty one."""
    from hpctrain.tracking.source import params_of

    env = {"torch": "2.13.0", "horovod": "0.28.1", "python": "3.11.7", "slurm": "24.11.5"}
    (tmp_path / records.ENV).write_text(json.dumps(env))
    params = params_of(tmp_path)
    assert {k: params[f"hpctrain.version.{k}"] for k in env} == env
    (tmp_path / records.ENV).write_text(json.dumps({**env, "slurm": None}))
    assert "hpctrain.version.slurm" not in params_of(tmp_path)
