"""Pipelines on the local SLURM cluster: 2 stages x 2 replicas across 2 nodes (a stage's replicas
share a node, the pipeline crosses nodes) give one local rank's weights; a pipeline run
interrupted mid-run is requeued and resumes bit-identically from the gathered checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.conftest import MLP, assert_same_weights, flat, hpctrain, signal_at_step, start_run, weights
from tests.slurm.test_slurm_runs import _recorded_steps, _wait_done, run_ok

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_cluster")]


def test_hybrid_across_two_nodes_matches_one_local_rank(tmp_path: Path, mlp_one_rank) -> None:
    slurm, s = run_ok(
        tmp_path,
        "slurm",
        *MLP,
        "parallelism=hybrid",
        "parallelism.engine=ddp",
        "cluster=slurm",
        "cluster.nodes=2",
        "cluster.ranks_per_node=2",
        "train.batch_per_rank=16",
    )
    local, _ = mlp_one_rank
    assert_same_weights(slurm, local, rtol=1e-5, atol=1e-6)
    hosts = [(r["host"], r["stage"]) for r in flat(s)["per_rank"]]
    assert len({h for h, _ in hosts}) == 2
    # each node holds one stage's two replicas
    assert {h for h, st in hosts if st == 0}.isdisjoint({h for h, st in hosts if st == 1}), hosts


def test_pipeline_requeue_resumes_bit_identical(tmp_path: Path) -> None:
    common = [
        *[o for o in MLP if not o.startswith("train.steps")],
        "train.steps=40",
        "parallelism=pipeline",
        "parallelism.schedule=1f1b",
        "train.batch_per_rank=32",
        "cluster=slurm",
        "cluster.nodes=2",
        "cluster.ranks_per_node=1",
    ]
    run_dir = tmp_path / "interrupted"
    r = hpctrain("run", "--no-wait", f"run.dir={run_dir}", *common, "debug.hold_step=15")
    assert r.returncode == 0, r.stderr
    straight = start_run(tmp_path / "straight", *common)  # the uninterrupted run, alongside
    job = signal_at_step(run_dir, 15)
    assert _wait_done(job) == "COMPLETED"
    log = hpctrain("logs", str(run_dir)).stdout
    assert "checkpoint step-000016.pt written after step 16" in log, log
    for rank in (0, 1):
        assert _recorded_steps(run_dir, rank) == list(range(40))
    assert _wait_done(straight) == "COMPLETED"
    a, b = weights(run_dir), weights(tmp_path / "straight")
    assert all(torch.equal(a[k], b[k]) for k in a), "weights differ from the uninterrupted run"
