"""The GPU tier's behaviour where there is no GPU (this machine, CI): `scripts/test.sh --gpu` exits
non-zero saying so, and the GPU tests are listed as not run with the count they need."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from tests.conftest import ROOT

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: the tier runs")


def test_the_gpu_tier_refuses_a_machine_without_a_gpu() -> None:
    env = dict(os.environ, HPCTRAIN_PYTHON=sys.executable)
    r = subprocess.run(
        ["bash", "scripts/test.sh", "--gpu"], capture_output=True, text=True, cwd=ROOT, env=env
    )
    assert r.returncode == 1
    assert "torch sees no CUDA GPU here" in r.stderr and f"torch {torch.__version__}" in r.stderr


def test_gpu_tests_are_listed_as_not_run_with_the_gpus_they_need() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-m", "gpu", "-rs", "-p", "no:cacheprovider", "tests/gpu"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout[-2000:]
    assert "test_the_clock_measures_the_device_not_the_host needs 1 GPU(s); this machine has 0" in r.stdout
    assert "test_two_gpus_two_ranks_equal_one_rank_each_on_its_own_device needs 2 GPU(s)" in r.stdout
