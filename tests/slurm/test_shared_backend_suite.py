"""One behavioural suite, run against every launch backend (as Hydra's LauncherTestSuite does):
local mpirun and SLURM must behave the same from the user's side."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import hpctrain

BACKENDS = {
    "local": ["cluster=local", "cluster.ranks=2"],
    "slurm": ["cluster=slurm", "cluster.nodes=2", "cluster.ranks_per_node=1"],
}
SMALL = ["data=digits", "train.steps=8", "train.warmup_steps=2", "train.batch_per_rank=16"]


@pytest.fixture(params=sorted(BACKENDS))
def backend(request: pytest.FixtureRequest) -> list[str]:
    if request.param == "slurm":
        request.getfixturevalue("slurm_cluster")
    return BACKENDS[request.param]


@pytest.mark.parametrize("comm", ["mpi", "gloo"])
def test_run_completes_with_full_records(backend: list[str], tmp_path: Path, comm: str) -> None:
    run_dir = tmp_path / "run"
    r = hpctrain("run", "--no-progress", f"run.dir={run_dir}", *backend, *SMALL, f"parallelism.backend={comm}")
    assert r.returncode == 0, r.stdout + r.stderr
    s = json.loads((run_dir / "summary.json").read_text())
    assert s["world_size"] == 2 and s["timed_steps"] == 6 and s["backend"] == comm
    assert "throughput" in r.stdout  # the summary table is printed
    for name in ("config.yaml", "plan.json", "env.json", "model.pt", "steps-rank0.jsonl", "steps-rank1.jsonl"):
        assert (run_dir / name).is_file(), name
    env = json.loads((run_dir / "env.json").read_text())
    assert len(env["hosts"]) == 2 and env["backend"] == comm


def test_failing_rank_is_named(backend: list[str], tmp_path: Path) -> None:
    r = hpctrain("run", "--no-progress", f"run.dir={tmp_path / 'f'}", *backend, *SMALL, "train.steps=300",
                 "debug.fail_rank=1", "debug.fail_step=2")
    assert r.returncode == 4
    assert "rank 1 failed" in r.stderr and "InjectedFailure" in r.stderr


def test_dry_run_starts_nothing(backend: list[str], tmp_path: Path) -> None:
    r = hpctrain("run", "--dry-run", f"run.dir={tmp_path / 'd'}", *backend, *SMALL)
    assert r.returncode == 0, r.stderr
    assert ("#SBATCH --nodes=2" in r.stdout) or ("mpirun -np 2" in r.stdout)
    assert not (tmp_path / "d").exists()


def test_invalid_config_is_rejected_before_launch(backend: list[str], tmp_path: Path) -> None:
    r = hpctrain("run", f"run.dir={tmp_path / 'bad'}", *backend, *SMALL, "optim.lr=-1")
    assert r.returncode == 2 and "optim.lr" in r.stderr
    assert not (tmp_path / "bad").exists()
