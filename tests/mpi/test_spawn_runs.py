"""Local ranks started without MPI (cluster.starter=spawn, as torchrun starts them): the same
weights as one rank, a failing rank named like under mpirun, Horovod over Gloo, and a machine
without Horovod installed, where the package imports, DDP runs and engine=horovod is refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import DIGITS_CNN as BASE
from tests.conftest import ROOT, assert_rank_1_failure_named, assert_same_weights, run_ok

pytestmark = [pytest.mark.mpi, pytest.mark.side_stream]  # in the SLURM stream: the two streams even out

SPAWN = ["cluster.starter=spawn", "cluster.ranks=2", "train.batch_per_rank=16"]


def test_spawned_ddp_ranks_equal_one_rank(tmp_path: Path, one_rank_reference) -> None:
    run, s = run_ok(tmp_path, "ddp", *BASE, *SPAWN, "parallelism.engine=ddp")
    assert_same_weights(one_rank_reference[0], run, rtol=1e-5, atol=1e-6)
    assert s["world_size"] == 2 and s["comm_s"] > 0 and 0 < s["mfu"] < 1
    plan = json.loads((run / "plan.json").read_text())
    assert plan["argv"][1:3] == ["-m", "hpctrain.launch.local.spawn"]  # no mpirun started it
    said = (run / "logs" / "rank0.log").read_text()  # each rank's output split out as under mpirun
    assert "step 12/12" in said and "<stdout>" not in said


def test_spawned_horovod_over_gloo_equals_one_rank(tmp_path: Path, one_rank_reference) -> None:
    run, _ = run_ok(tmp_path, "gloo", *BASE, *SPAWN, "parallelism.backend=gloo")
    assert_same_weights(one_rank_reference[0], run, rtol=1e-5, atol=1e-6)


def test_a_killed_spawned_rank_ends_the_run_and_is_named(tmp_path: Path) -> None:
    assert_rank_1_failure_named(tmp_path, "kill", *BASE, *SPAWN, "parallelism.engine=ddp")


def test_without_horovod_installed_ddp_runs_and_horovod_is_refused(tmp_path: Path) -> None:
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text(
        "import sys\n"
        "class NoHorovod:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'horovod' or name.startswith('horovod.'):\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, NoHorovod())\n"
    )
    env = dict(os.environ, PYTHONPATH=str(hide), COLUMNS="200")

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "hpctrain.cli", "run", "--no-progress", *args]
        return subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)

    probe = subprocess.run(
        [sys.executable, "-c", "import hpctrain.cli, hpctrain.rank\nimport horovod"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert "No module named 'horovod'" in probe.stderr  # hidden indeed, and hpctrain imported first
    r = cli(f"run.dir={tmp_path / 'ddp'}", *BASE, *SPAWN)  # the default engine: DDP without Horovod
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads((tmp_path / "ddp" / "summary.json").read_text())["engine"] == "ddp"
    r = cli(f"run.dir={tmp_path / 'hvd'}", *BASE, "parallelism.engine=horovod")
    assert r.returncode == 2 and "parallelism.engine: horovod is not installed" in r.stderr, r.stderr
    assert "hpctrain install horovod" in r.stderr
    assert "engine=ddp" in r.stderr and not (tmp_path / "hvd").exists()  # refused before anything
