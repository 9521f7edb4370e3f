"""The real local SLURM cluster (slurm/start.sh) for every test here: started once per session,
stopped at the end. If it cannot start, these tests fail; they never skip."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT

STATE = Path(os.environ.get("HPCTRAIN_SLURM_STATE", "/tmp/hpctrain-slurm"))


def _running(conf: str) -> bool:
    env = dict(os.environ, SLURM_CONF=conf)
    if not (Path(conf).exists() and shutil.which("scontrol")):
        return False
    return subprocess.run(["scontrol", "ping"], env=env, capture_output=True).returncode == 0


def _stray_outputs() -> set[Path]:
    """SLURM's default output files (slurm-<job>.out) where the tests submit from."""
    return set(ROOT.glob("slurm-*.out")) | set(Path.cwd().glob("slurm-*.out"))


@pytest.fixture(scope="session")
def slurm_cluster():
    """Start the cluster (slurm/start.sh is idempotent); stop it afterwards only if this session
    started it, so a developer's running cluster, or another test session's, is left alone.
    Every job hpctrain submits names its output files: none may land in the submitting directory."""
    before = _stray_outputs()
    conf = str(STATE / "etc" / "slurm.conf")
    was_running = _running(conf)
    r = subprocess.run(
        ["bash", str(ROOT / "slurm" / "start.sh")], capture_output=True, text=True, timeout=600
    )
    assert r.returncode == 0, f"local SLURM cluster did not start:\n{r.stdout}\n{r.stderr}"
    old = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = conf
    yield conf
    stray = _stray_outputs() - before
    if not was_running:
        subprocess.run(["bash", str(ROOT / "slurm" / "stop.sh")], capture_output=True, text=True, timeout=300)
    if old is None:
        os.environ.pop("SLURM_CONF", None)
    else:
        os.environ["SLURM_CONF"] = old
    assert not stray, (
        f"jobs wrote SLURM's default output files into the submitting directory: {sorted(stray)}"
    )


def sacct_state(job_id: str) -> str:
    out = subprocess.run(
        ["sacct", "-X", "-n", "-P", "-o", "State", "-j", job_id], capture_output=True, text=True
    ).stdout.split()
    return out[0] if out else ""
