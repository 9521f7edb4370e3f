"""torch DDP across 2 nodes of the local SLURM cluster: the same weights as one local rank, and a
requeue mid-run that resumes bit-identically (rendezvous again on the requeued job)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.conftest import DIGITS_CNN, assert_same_weights, hpctrain, signal_at_step, start_run, weights
from tests.slurm.test_slurm_runs import _recorded_steps, _wait_done, run_ok

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_cluster")]

COMMON = ["data=digits", "train.warmup_steps=2", "parallelism.engine=ddp"]
TWO_NODES = ["cluster=slurm", "cluster.nodes=2", "cluster.ranks_per_node=1"]


def test_ddp_on_two_nodes_matches_one_local_rank(tmp_path: Path, one_rank_reference) -> None:
    slurm, s = run_ok(
        tmp_path, "slurm", *DIGITS_CNN, *TWO_NODES, "parallelism.engine=ddp", "train.batch_per_rank=16"
    )
    local, _ = one_rank_reference  # the global batch of 32 on one local rank (Horovod's)
    assert_same_weights(slurm, local, rtol=1e-5, atol=1e-6)
    assert s["engine"] == "ddp" and len({r["host"] for r in s["per_rank"]}) == 2
    assert s["hosts"] == sorted({r["host"] for r in s["per_rank"]}) and s["nodes"] == 2  # its placement


@pytest.mark.slurm_versions
def test_ddp_requeue_resumes_bit_identical(tmp_path: Path) -> None:
    common = [*COMMON, *TWO_NODES, "train.steps=60"]
    run_dir = tmp_path / "interrupted"
    r = hpctrain("run", "--no-wait", f"run.dir={run_dir}", *common, "debug.hold_step=20")
    assert r.returncode == 0, r.stderr
    straight = start_run(tmp_path / "straight", *common)  # the uninterrupted run, alongside
    job = signal_at_step(run_dir, 20)  # what SLURM sends before the time limit
    assert _wait_done(job) == "COMPLETED"
    log = hpctrain("logs", str(run_dir)).stdout
    assert "checkpoint step-000021.pt written after step 21" in log, log
    for rank in (0, 1):
        assert _recorded_steps(run_dir, rank) == list(range(60))
    assert _wait_done(straight) == "COMPLETED"
    a, b = weights(run_dir), weights(tmp_path / "straight")
    assert all(torch.equal(a[k], b[k]) for k in a), "weights differ from the uninterrupted run"
