"""`bench submit`'s count of SLURM commands: this process's calls, not those of the jobs it submits."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from hpctrain.bench.submit import _all_calls, _count_calls


@pytest.mark.slurm  # SLURM's commands on PATH (no controller needed): the quick tier may run without them
def test_the_count_holds_the_benchs_own_calls_not_those_of_its_jobs(monkeypatch: pytest.MonkeyPatch) -> None:
    # CI, the evening of 2026-11-29: a submitted task started before the jobs were cancelled and
    # asked `scontrol --version` through the inherited PATH; the sweep's submission read 3 scontrol
    # calls, not 1 (the commands need no controller to be counted: their exit status does not matter)
    monkeypatch.setenv("PATH", os.environ["PATH"])
    log = _count_calls()
    subprocess.run(["scontrol", "--version"], capture_output=True, check=False)
    subprocess.run(["sh", "-c", "scontrol --version; sinfo --version"], capture_output=True, check=False)
    counted = _all_calls(log)
    shutil.rmtree(log.parent)
    assert {t: n for t, n in counted.items() if n} == {"scontrol": 1}
