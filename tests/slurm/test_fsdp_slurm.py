"""Sharded data parallelism on the local SLURM cluster: hsdp on 2 nodes x 2 ranks (each node a
shard group, the groups replicas) and fsdp with its shards across the 2 nodes give the weights of
one local rank; a requeued fsdp job resumes from its sharded checkpoint bit-identically."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.conftest import MLP, assert_same_weights, hpctrain, signal_at_step, start_run, weights
from tests.slurm.test_slurm_runs import _recorded_steps, _wait_done, run_ok

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_cluster")]


@pytest.mark.parametrize(
    ("parallelism", "per_node"), [("hsdp", 2), ("fsdp", 1)], ids=["hsdp-node-groups", "fsdp-across-nodes"]
)
def test_sharded_on_two_nodes_matches_one_local_rank(
    tmp_path: Path, mlp_one_rank, parallelism: str, per_node: int
) -> None:
    slurm, s = run_ok(
        tmp_path,
        "slurm",
        *MLP,
        f"parallelism={parallelism}",
        "cluster=slurm",
        "cluster.nodes=2",
        f"cluster.ranks_per_node={per_node}",
        "train.batch_per_rank=null",
        "train.global_batch=32",
    )
    assert_same_weights(slurm, mlp_one_rank[0], rtol=1e-5, atol=1e-6)
    hosts = [r["host"] for r in s["per_rank"]]
    assert len(set(hosts)) == 2 and s["shard_degree"] == 2  # hsdp: one node's 2 ranks; fsdp: the world
    if parallelism == "hsdp":  # a shard group is one node's ranks
        assert hosts[0] == hosts[1] != hosts[2] == hosts[3], hosts


def test_fsdp_requeue_resumes_bit_identical(tmp_path: Path) -> None:
    common = [
        *[o for o in MLP if not o.startswith("train.steps")],
        "train.steps=40",
        "parallelism=fsdp",
        "cluster=slurm",
        "cluster.nodes=2",
        "cluster.ranks_per_node=1",
    ]
    run_dir = tmp_path / "interrupted"
    r = hpctrain("run", "--no-wait", f"run.dir={run_dir}", *common, "debug.hold_step=20")
    assert r.returncode == 0, r.stderr
    straight = start_run(tmp_path / "straight", *common)
    job = signal_at_step(run_dir, 20)
    assert _wait_done(job) == "COMPLETED"
    log = hpctrain("logs", str(run_dir)).stdout
    assert "checkpoint step-000021.dcp written after step 21" in log, log
    assert "resuming from" in log and "step-000021.dcp at step 21" in log, log
    for rank in (0, 1):
        assert _recorded_steps(run_dir, rank) == list(range(40))
    assert _wait_done(straight) == "COMPLETED"
    a, b = weights(run_dir), weights(tmp_path / "straight")
    assert all(torch.equal(a[k], b[k]) for k in a), "weights differ from the uninterrupted run"
