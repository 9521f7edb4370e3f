"""A node lost mid-run on the local SLURM cluster (tests/conftest.py lose_node: every process of
the node killed, its slurmd first, as a power cut leaves it): with train.elastic the run goes on
with the node left and ends on the one-rank weights; without, it waits in the queue for its full
size and goes on when the node is back. Both jobs run side by side."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.conftest import (
    DIGITS_CNN,
    HOROVOD_IDLE,
    assert_same_weights,
    drop_idle_group,
    hpctrain,
    idle_ranks_of,
    lines,
    lose_node,
    restore_nodes,
    start_run,
    wait_done,
    wait_for,
)

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_cluster")]

# 2 nodes x 1 rank, the one-rank reference's global batch of 32; a checkpoint after step 4; rank 1
# sleeps 1 s a step (rank 0 waits for it: HOROVOD_IDLE), so the test can lose its node after step 6 of 12
COMMON = [
    *DIGITS_CNN, "cluster=slurm", "cluster.nodes=2", "cluster.ranks_per_node=1", "train.batch_per_rank=16",
    "cluster.checkpoint_interval=4", "train.max_restarts=1", "debug.slow_rank=1", "debug.slow_s=1",
    HOROVOD_IDLE,
]  # fmt: skip


def _others_on(nodes: str, ours: set[str]) -> set[str]:
    """Jobs other than ours on `nodes` (losing a node must not take another test's job with it)."""
    out = subprocess.run(["squeue", "-h", "-w", nodes, "-o", "%A"], capture_output=True, text=True).stdout
    return set(out.split()) - ours


def _down(nodes: str) -> bool:
    out = subprocess.run(
        ["sinfo", "-h", "-N", "-n", nodes, "-o", "%t"], capture_output=True, text=True
    ).stdout
    return bool(out.split()) and all(state.startswith("down") for state in out.split())


def _queue_state(job: str) -> str:
    return subprocess.run(
        ["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True
    ).stdout.strip()


def _steps(job: str) -> dict[str, str]:
    out = subprocess.run(
        ["sacct", "-j", job, "-n", "-P", "-o", "JobID,State"], capture_output=True, text=True
    )
    return dict(line.split("|", 1) for line in out.stdout.splitlines())


@pytest.mark.slurm_versions
def test_a_lost_node_is_left_behind_with_elastic_and_waited_for_without(
    tmp_path: Path, one_rank_reference: tuple[Path, dict]
) -> None:
    from hpctrain.records.restarts import read_restarts

    elastic, rigid = tmp_path / "elastic", tmp_path / "rigid"
    # the session's time-limit jobs may still hold nodes: losing one must not take them with it
    wait_for("other jobs to leave n2 and n4", lambda: not _others_on("n2,n4", set()), 240)
    jobs = {
        elastic: start_run(elastic, *COMMON, "train.elastic=true", "cluster.nodelist=[n3,n4]"),
        rigid: start_run(rigid, *COMMON, "cluster.nodelist=[n1,n2]"),
    }
    try:
        for run_dir in jobs:
            wait_for(f"step 6 of {run_dir.name}", lambda d=run_dir: lines(d / "steps-rank0.jsonl") >= 6, 180)
        lose_node("n4")
        lose_node("n2")
        # the survivors wait for slurmctld to end their step: not on other tests' CPU
        moved = [idle_ranks_of(d) for d in jobs]
        assert all(n is None or n >= 1 for n in moved), moved
        # slurmctld takes both down; the rigid job is requeued and waits for n1 and n2 (its
        # nodelist), the elastic one goes on; only then are the nodes brought back (a node back
        # before slurmctld gave up on it would still hold the killed step's place)
        wait_for("n2 and n4 down", lambda: _down("n2,n4"), 120)
        wait_for("the rigid job to wait in the queue", lambda: _queue_state(jobs[rigid]) == "PENDING", 150)
        assert read_restarts(rigid), "the requeue is recorded before it is made"
        wait_for("the elastic job's restart", lambda: bool(read_restarts(elastic)), 120)
    finally:
        restore_nodes()
        drop_idle_group()
    assert wait_done(jobs[elastic]) == "COMPLETED" and wait_done(jobs[rigid]) == "COMPLETED"

    [went_on] = read_restarts(elastic)
    # from the newest checkpoint (every 4 steps) before the loss, at step 6 or later
    assert went_on.lost_nodes == ["n4"] and went_on.failed_at_step >= 6, went_on
    assert went_on.resumed_from == 4 * (went_on.failed_at_step // 4), went_on
    assert went_on.change.startswith("went on with 2 -> 1 ranks on 1 node(s), global batch 32 -> 32"), went_on
    summary = json.loads((elastic / "summary.json").read_text())
    assert summary["world_size"] == 1 and summary["restarts"] == 1 and summary["nodes_lost"] == ["n4"], (
        summary
    )
    # the same samples every step (global batch kept): one rank's weights
    assert_same_weights(elastic, one_rank_reference[0], rtol=1e-5, atol=1e-6)
    assert json.loads((elastic / "plan-restart1.json").read_text())["world_size"] == 1
    steps = _steps(jobs[elastic])
    assert steps[f"{jobs[elastic]}.1"] == "COMPLETED" and steps[jobs[elastic]] == "COMPLETED", steps
    status = hpctrain("status", str(elastic), timeout=60).stdout
    assert "node(s) n4 lost; went on with 2 -> 1 ranks" in status, status

    [waited] = read_restarts(rigid)
    assert (
        waited.lost_nodes == ["n2"]
        and waited.change == "requeued to wait for 2 node(s) (train.elastic=false)"
    )
    summary = json.loads((rigid / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["restarts"] == 1, summary
    assert_same_weights(rigid, one_rank_reference[0], rtol=1e-5, atol=1e-6)
    hosts = json.loads((rigid / "env.json").read_text())["hosts"]
    assert sorted(hosts) == ["n1", "n2"], hosts
