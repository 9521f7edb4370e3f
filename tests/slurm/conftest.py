"""The real local SLURM cluster (slurm/start.sh) for every test here: started once per session,
stopped at the end. If it cannot start, these tests fail; they never skip."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT

STATE = Path(os.environ.get("HPCTRAIN_SLURM_STATE", "/tmp/hpctrain-slurm"))


@pytest.fixture(scope="session")
def slurm_cluster():
    r = subprocess.run(["bash", str(ROOT / "slurm" / "start.sh")], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"local SLURM cluster did not start:\n{r.stdout}\n{r.stderr}"
    conf = str(STATE / "etc" / "slurm.conf")
    old = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = conf
    yield conf
    subprocess.run(["bash", str(ROOT / "slurm" / "stop.sh")], capture_output=True, text=True, timeout=300)
    if old is None:
        os.environ.pop("SLURM_CONF", None)
    else:
        os.environ["SLURM_CONF"] = old


def sacct_state(job_id: str) -> str:
    out = subprocess.run(["sacct", "-X", "-n", "-P", "-o", "State", "-j", job_id],
                         capture_output=True, text=True).stdout.split()
    return out[0] if out else ""
