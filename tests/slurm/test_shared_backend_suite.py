"""One behavioural suite, run against every launch backend (as Hydra's LauncherTestSuite does):
local mpirun, local ranks spawned without MPI (Horovod over Gloo) and SLURM must behave the same
from the user's side."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import IDLE_TRAINING, hpctrain, hpctrain_here, lines, processes_of, wait_for

BACKENDS = {
    "local": ["cluster=local", "cluster.ranks=2"],
    "spawn": ["cluster=local", "cluster.ranks=2", "cluster.starter=spawn", "parallelism.backend=gloo"],
    "slurm": ["cluster=slurm", "cluster.nodes=2", "cluster.ranks_per_node=1"],
}
# What each backend's dry run must show: the exact launch of 2 ranks.
DRY_RUN = {
    "local": "mpirun -np 2",
    "spawn": "hpctrain.launch.local.spawn -np 2",
    "slurm": "#SBATCH --nodes=2",
}
SMALL = ["data=digits", "train.steps=8", "train.warmup_steps=2", "train.batch_per_rank=16"]


pytestmark = pytest.mark.mpi  # every case starts real ranks (the slurm cases: marked slurm too)


# the SLURM cases share the cluster and join the SLURM stream; the spawned ones join it too, as
# side_stream (tests/conftest.py): the local stream is the suite's longest
MARKS = {"slurm": [pytest.mark.slurm], "spawn": [pytest.mark.side_stream]}


@pytest.fixture(params=[pytest.param(b, marks=MARKS.get(b, [])) for b in sorted(BACKENDS)])
def backend(request: pytest.FixtureRequest) -> list[str]:
    if request.param == "slurm":
        request.getfixturevalue("slurm_cluster")
    return BACKENDS[request.param]


def _name(backend: list[str]) -> str:
    return next(name for name, overrides in BACKENDS.items() if overrides == backend)


def _launcher(backend: list[str]) -> str:
    """What job.json names: spawn is the local launcher's other way to start ranks."""
    return backend[0].split("=")[1]


def _status(run_dir: Path) -> str:
    r = hpctrain("status", str(run_dir), timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


@pytest.mark.parametrize("comm", ["mpi", "gloo"])
def test_run_completes_with_full_records(backend: list[str], tmp_path: Path, comm: str) -> None:
    run_dir = tmp_path / "run"
    r = hpctrain(
        "run", "--no-progress", f"run.dir={run_dir}", *backend, *SMALL, f"parallelism.backend={comm}"
    )
    if _name(backend) == "spawn" and comm == "mpi":  # no MPI without mpirun: refused, nothing made
        assert r.returncode == 2 and "cluster.starter: spawn starts the ranks without MPI" in r.stderr
        assert not run_dir.exists()
        return
    assert r.returncode == 0, r.stdout + r.stderr
    s = json.loads((run_dir / "summary.json").read_text())
    assert s["world_size"] == 2 and s["timed_steps"] == 6 and s["backend"] == comm
    assert "throughput" in r.stdout  # the summary table is printed
    for name in (
        "config.yaml",
        "plan.json",
        "env.json",
        "model.pt",
        "steps-rank0.jsonl",
        "steps-rank1.jsonl",
    ):
        assert (run_dir / name).is_file(), name
    env = json.loads((run_dir / "env.json").read_text())
    assert len(env["hosts"]) == 2 and env["backend"] == comm


def test_failing_rank_is_named(backend: list[str], tmp_path: Path) -> None:
    r = hpctrain(
        "run",
        "--no-progress",
        f"run.dir={tmp_path / 'f'}",
        *backend,
        *SMALL,
        "train.steps=300",
        "debug.fail_rank=1",
        "debug.fail_step=2",
    )
    assert r.returncode == 4
    assert "rank 1 failed" in r.stderr and "InjectedFailure" in r.stderr


def test_dry_run_starts_nothing(backend: list[str], tmp_path: Path) -> None:
    r = hpctrain_here("run", "--dry-run", f"run.dir={tmp_path / 'd'}", *backend, *SMALL)
    assert r.returncode == 0, r.stderr
    assert DRY_RUN[_name(backend)] in r.stdout
    for other in (v for k, v in DRY_RUN.items() if k != _name(backend)):
        assert other not in r.stdout
    assert not (tmp_path / "d").exists()


def test_invalid_config_is_rejected_before_launch(backend: list[str], tmp_path: Path) -> None:
    r = hpctrain_here("run", f"run.dir={tmp_path / 'bad'}", *backend, *SMALL, "optim.lr=-1")
    assert r.returncode == 2 and "optim.lr" in r.stderr
    assert not (tmp_path / "bad").exists()


@pytest.mark.slurm_versions
def test_no_wait_run_finishes_and_status_and_logs_show_it(backend: list[str], tmp_path: Path) -> None:
    run_dir = tmp_path / "nw"
    r = hpctrain("run", "--no-wait", f"run.dir={run_dir}", *backend, *SMALL)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"hpctrain status {run_dir}" in r.stdout  # it says how to follow the run
    assert json.loads((run_dir / "job.json").read_text())["launcher"] == _launcher(backend)
    follow = hpctrain("logs", str(run_dir), "--follow", timeout=300)  # returns when the run ends
    assert follow.returncode == 0 and "step 8/8" in follow.stdout, follow.stdout + follow.stderr
    assert "@@hpctrain" not in follow.stdout  # progress events are not shown as log lines
    wait_for("COMPLETED", lambda: "COMPLETED" in _status(run_dir), timeout_s=180)
    assert "step 8," in _status(run_dir)  # progress from rank 0's step records
    assert json.loads((run_dir / "summary.json").read_text())["world_size"] == 2


def test_a_run_outlives_the_command_that_stopped_waiting_for_it(backend: list[str], tmp_path: Path) -> None:
    """--timeout-min stops the waiting, not the run (issue 23: a local run was once cancelled when
    its command gave up): it finishes COMPLETED, and status and logs see it. The run outlives the
    command's 1.2 s by its pace (rank 0 sleeps 50 ms a step: 3 s), not by 600 steps of training."""
    run_dir = tmp_path / "outlives"
    r = hpctrain(
        "run",
        "--no-progress",
        "--timeout-min=0.02",
        f"run.dir={run_dir}",
        *backend,
        *SMALL,
        "train.steps=60",
        *IDLE_TRAINING,
    )
    assert r.returncode == 3 and "they keep running" in r.stderr, r.stdout + r.stderr
    wait_for(
        "the run to end",
        lambda: "RUNNING" not in (st := _status(run_dir)) and "PENDING" not in st,
        timeout_s=240,
    )
    assert "COMPLETED" in _status(run_dir)
    if _launcher(backend) == "local":  # the supervisor's own record agrees
        assert json.loads((run_dir / "state.json").read_text())["state"] == "COMPLETED"
    assert lines(run_dir / "steps-rank0.jsonl") == 60 and (run_dir / "summary.json").exists()
    logs = hpctrain("logs", str(run_dir), "--rank", "0")
    assert logs.returncode == 0 and "step 60/60" in logs.stdout, logs.stdout + logs.stderr


def test_cancel_stops_a_running_job_and_status_shows_it(backend: list[str], tmp_path: Path) -> None:
    run_dir = tmp_path / "long"
    r = hpctrain(
        "run",
        "--no-wait",
        f"run.dir={run_dir}",
        *backend,
        *SMALL,
        "train.steps=100000",
        "train.log_interval=10",
        *IDLE_TRAINING,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    job = json.loads((run_dir / "job.json").read_text())["job_id"]
    wait_for(
        "the first 20 steps",
        lambda: (
            "RUNNING" in _status(run_dir)
            and len((run_dir / "steps-rank0.jsonl").read_text().splitlines()) >= 20
            if (run_dir / "steps-rank0.jsonl").exists()
            else False
        ),
        timeout_s=180,
    )
    r = hpctrain("cancel", str(run_dir))
    assert r.returncode == 0 and f"cancelled 1 job(s): {job}" in r.stdout, r.stdout + r.stderr
    wait_for("CANCELLED", lambda: "CANCELLED" in _status(run_dir), timeout_s=180)
    again = hpctrain("cancel", str(run_dir))  # a second cancel says it had ended, and cancels nothing
    assert again.returncode == 0 and f"already ended: {job} (CANCELLED)" in again.stdout, again.stdout
    if _launcher(backend) == "local":  # nothing of the run is left on this machine
        wait_for("no process left", lambda: not processes_of(run_dir), timeout_s=30)
    assert not (run_dir / "summary.json").exists()
    logs = hpctrain("logs", str(run_dir), "--rank", "0")
    assert logs.returncode == 0 and "step 10/100000" in logs.stdout
