"""Rejected configs never reach sbatch: a recording shim stands first on PATH and forwards to
the real sbatch; accepted hostile values are quoted and run harmlessly in a real job."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, hpctrain_here
from tests.unit.test_slurm_plan import INVALID_SLURM

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_cluster")]


@pytest.fixture
def sbatch_log(tmp_path: Path) -> Path:
    shim_dir = tmp_path / "shim"
    shim_dir.mkdir()
    log = tmp_path / "sbatch-calls.log"
    real = shutil.which("sbatch")
    assert real, "sbatch is not installed"
    (shim_dir / "sbatch").write_text(f'#!/bin/sh\necho "$@" >> {log}\nexec {real} "$@"\n')
    (shim_dir / "sbatch").chmod(0o755)
    log.touch()
    return log


def _run(log: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PATH=f"{log.parent / 'shim'}:{os.environ['PATH']}")
    return subprocess.run(
        [sys.executable, "-m", "hpctrain.cli", "run", "--no-progress", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env=env,
    )


@pytest.mark.parametrize("overrides,key", INVALID_SLURM, ids=[" ".join(o) for o, _ in INVALID_SLURM])
def test_rejected_config_makes_no_sbatch_call(
    sbatch_log: Path, tmp_path: Path, overrides: list[str], key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", f"{sbatch_log.parent / 'shim'}:{os.environ['PATH']}")
    r = hpctrain_here("run", "--no-progress", "cluster=slurm", f"run.dir={tmp_path / 'run'}", *overrides)
    assert r.returncode == 2, r.stdout + r.stderr
    assert key in r.stderr
    assert sbatch_log.read_text() == ""  # nothing was submitted
    assert not (tmp_path / "run").exists()


def test_hostile_env_value_runs_quoted(sbatch_log: Path, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    r = _run(
        sbatch_log,
        "cluster=slurm",
        f"run.dir={tmp_path / 'run'}",
        "data=digits",
        "train.steps=3",
        "train.warmup_steps=1",
        f"+cluster.env.EVIL='$(touch {marker})'",
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert len(sbatch_log.read_text().splitlines()) == 1  # one job, one sbatch call
    assert not marker.exists()  # the value was never executed
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["world_size"] == 2


def test_unreachable_controller_is_a_clear_launch_error(tmp_path: Path) -> None:
    """No controller at the configured address: exit 3 with sbatch's message, no traceback."""
    conf = tmp_path / "slurm.conf"
    real = Path(os.environ["SLURM_CONF"]).read_text()
    # sbatch tries the controller for MessageTimeout seconds before it gives up
    conf.write_text(
        real.replace("SlurmctldPort=16817", "SlurmctldPort=16899").replace(
            "MessageTimeout=20", "MessageTimeout=3"
        )
    )
    env = dict(os.environ, SLURM_CONF=str(conf))
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "hpctrain.cli",
            "run",
            "cluster=slurm",
            f"run.dir={tmp_path / 'r'}",
            "data=digits",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env=env,
    )
    assert r.returncode == 3, r.stderr
    assert "sbatch refused the job" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "r").exists()  # issue 72 class 8: the refused run's directory stayed
