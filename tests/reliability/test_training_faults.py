"""Training that would go on into garbage is stopped: a loss that becomes NaN or infinite ends
the run naming the step and rank (configurable)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from hpctrain import records
from tests.conftest import hpctrain

pytestmark = pytest.mark.mpi

DIVERGING = ["data=digits", "train.steps=20", "train.warmup_steps=1", "optim.lr=1e6"]


def test_a_nan_loss_stops_the_run_naming_the_step_and_rank(tmp_path: Path) -> None:
    run_dir = tmp_path / "nan"
    r = hpctrain("run", "--no-progress", f"run.dir={run_dir}", *DIVERGING, timeout=300)
    assert r.returncode == 4, r.stdout + r.stderr
    errors = [json.loads(p.read_text()) for p in run_dir.glob("error-rank*.json")]
    error = min(errors, key=lambda e: e["time"])  # the rank that failed first is the one reported
    assert error["type"] == "NonFiniteLoss"
    path = run_dir / f"steps-rank{error['rank']}.jsonl"
    steps = records.read_steps(path)
    bad = steps[-1]  # the record of the step that went non-finite is kept, and is the last
    assert not math.isfinite(bad.loss) and all(math.isfinite(s.loss) for s in steps[:-1])
    # written as standard JSON: the non-finite loss is null, not Python's NaN or Infinity
    assert json.loads(path.read_text().splitlines()[-1], parse_constant=lambda c: c)["loss"] is None
    assert f"the loss is {bad.loss} at step {bad.step} on rank {error['rank']}" in r.stderr, r.stderr
    assert not (run_dir / "summary.json").exists()


def test_the_stop_can_be_turned_off(tmp_path: Path) -> None:
    run_dir = tmp_path / "on"
    r = hpctrain(
        "run",
        "--no-progress",
        f"run.dir={run_dir}",
        *DIVERGING,
        "train.stop_on_nonfinite_loss=false",
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads((run_dir / "summary.json").read_text())["timed_steps"] == 19
