"""Sharded data parallelism on the local SLURM cluster: hsdp on 2 nodes x 2 ranks (each node a
shard group, the groups replicas) and 2-D TP x FSDP (a tensor-parallel group inside each node,
the shards across the 2 nodes) give the weights of one local rank, and the 2-D job requeued
mid-run resumes from its sharded checkpoint bit-identically (the DDP engine's rendezvous again on
the requeued job, as for plain DDP)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.conftest import MLP, assert_same_weights, flat, hpctrain, signal_at_step, start_run, weights
from tests.slurm.test_slurm_runs import _recorded_steps, _wait_done, run_ok

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_cluster")]

TWO_NODES = ["cluster=slurm", "cluster.nodes=2", "train.batch_per_rank=null", "train.global_batch=32"]


def test_hsdp_with_a_shard_group_per_node_matches_one_local_rank(tmp_path: Path, mlp_one_rank) -> None:
    slurm, s = run_ok(tmp_path, "slurm", *MLP, "parallelism=hsdp", *TWO_NODES, "cluster.ranks_per_node=2")
    assert_same_weights(slurm, mlp_one_rank[0], rtol=1e-5, atol=1e-6)
    hosts = [r["host"] for r in s["per_rank"]]
    assert hosts[0] == hosts[1] != hosts[2] == hosts[3], hosts  # a shard group is one node's ranks
    assert flat(s)["shard_degree"] == 2 and s["parallelism"] == "hsdp"


def test_tp_inside_nodes_x_fsdp_across_matches_one_rank_and_resumes_a_requeue_bit_identically(
    tmp_path: Path, mlp_one_rank
) -> None:
    common = [*MLP, "parallelism=fsdp", "parallelism.tp.degree=2", *TWO_NODES, "cluster.ranks_per_node=2"]
    run_dir = tmp_path / "interrupted"
    r = hpctrain("run", "--no-wait", f"run.dir={run_dir}", *common, "debug.hold_step=4")
    assert r.returncode == 0, r.stderr
    straight = start_run(tmp_path / "straight", *common)
    job = signal_at_step(run_dir, 4)  # what SLURM sends before the time limit
    assert _wait_done(job) == "COMPLETED"
    log = hpctrain("logs", str(run_dir)).stdout
    assert "checkpoint step-000005.dcp written after step 5" in log, log
    assert "step-000005.dcp at step 5" in log, log
    for rank in range(4):
        assert _recorded_steps(run_dir, rank) == list(range(8))
    assert _wait_done(straight) == "COMPLETED"
    assert_same_weights(tmp_path / "straight", mlp_one_rank[0], rtol=1e-5, atol=1e-6)  # shards across nodes
    s = json.loads((tmp_path / "straight" / "summary.json").read_text())
    hosts = [r["host"] for r in s["per_rank"]]
    assert hosts[0] == hosts[1] != hosts[2] == hosts[3], hosts  # a tensor-parallel group is one node's
    assert (flat(s)["tp_degree"], flat(s)["shard_degree"]) == (2, 2)
    a, b = weights(run_dir), weights(tmp_path / "straight")
    assert all(torch.equal(a[k], b[k]) for k in a), "weights differ from the uninterrupted run"


def test_tp_inside_nodes_x_pp_x_fsdp_across_4_nodes_matches_one_rank(tmp_path: Path, mlp_one_rank) -> None:
    """3-D on 4 nodes x 2 ranks (the local nodes have 2 CPUs each): each node a tensor-parallel pair,
    a stage's 2 shards on 2 nodes, the 2 stages on the other 2 (Megatron-LM's order, outermost
    first: stage, shard, tensor rank)."""
    run, s = run_ok(
        tmp_path, "3d", *MLP, "parallelism=fsdp", "parallelism.engine=ddp", "parallelism.stages=2",
        "parallelism.microbatches=2", "parallelism.tp.degree=2", "cluster=slurm", "cluster.nodes=4",
        "cluster.ranks_per_node=2", "train.batch_per_rank=null", "train.global_batch=32",
    )  # fmt: skip
    assert_same_weights(run, mlp_one_rank[0], rtol=1e-5, atol=1e-6)
    assert (flat(s)["stages"], flat(s)["shard_degree"], flat(s)["tp_degree"], s["world_size"]) == (
        2,
        2,
        2,
        8,
    ), s
    ranks = sorted(flat(s)["per_rank"], key=lambda r: r["rank"])
    hosts = [r["host"] for r in ranks]
    assert all(hosts[i] == hosts[i + 1] for i in range(0, 8, 2)) and len(set(hosts)) == 4, hosts
    assert [r["stage"] for r in ranks] == [0] * 4 + [1] * 4
