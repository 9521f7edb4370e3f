"""Layouts that compose, on real mpirun: the degrees of one mesh (pipeline stages x replicas x
shards x tensor parallelism) in any combination end on one rank's weights (the built-in
transformer, fp32, the whole batch of 32): TorchTitan's 3-D PP x FSDP x TP on 8 ranks, then
resumed from its sharded checkpoint at another layout and engine; TP with DDP-like replicas;
PP x FSDP; PP x TP with sequence parallelism and activation checkpointing
(parallel/pipeline/mesh.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import TINY_LM, assert_resumes_on_one_rank, assert_same_weights, flat, run_ok

pytestmark = pytest.mark.mpi

GLOBAL_32 = ["parallelism.engine=ddp", "train.batch_per_rank=null", "train.global_batch=32"]
PP2 = ["parallelism.stages=2", "parallelism.microbatches=2"]


def test_pp_x_fsdp_x_tp_on_8_ranks_equals_one_rank_and_resumes_at_another_layout(
    tmp_path: Path, lm_one_rank: tuple[Path, dict]
) -> None:
    """The issue's spelling, today's keys: parallelism=fsdp parallelism.stages=2
    parallelism.microbatches=2 parallelism.tp.degree=2 cluster.ranks=8."""
    run, s = run_ok(
        tmp_path, "3d", *TINY_LM, *GLOBAL_32, "parallelism=fsdp", *PP2, "parallelism.tp.degree=2",
        "cluster.ranks=8", "cluster.checkpoint_interval=2",
    )  # fmt: skip
    assert_same_weights(lm_one_rank[0], run, rtol=1e-5, atol=1e-6)
    assert (flat(s)["stages"], flat(s)["shard_degree"], flat(s)["tp_degree"], s["world_size"]) == (
        2,
        2,
        2,
        8,
    ), s
    assert s["last_loss"] == pytest.approx(lm_one_rank[1]["last_loss"], rel=1e-5)
    layout = json.loads((run / "plan.json").read_text())["layout"]
    assert (layout["stages"], layout["replicate"], layout["shard"], layout["tp"]) == (2, 1, 2, 2)
    # each rank holds a quarter of its stage at most: half of it split, then sharded in two
    whole = lm_one_rank[1]["per_rank"][0]["param_bytes"]
    assert all(r["param_bytes"] < whole / 2 for r in s["per_rank"]), [r["param_bytes"] for r in s["per_rank"]]
    assert {r["stage"] for r in flat(s)["per_rank"]} == {0, 1}
    # resumed at step 4 by one rank under Horovod: the optimizer state is keyed by parameter name
    saved = run / "checkpoints" / "step-000004.dcp"
    said = assert_resumes_on_one_rank(tmp_path, saved, lm_one_rank[0], *TINY_LM)
    assert "at step 4 (written by 8 ranks, resharded to 1)" in said, said


@pytest.mark.parametrize(
    ("extra", "mesh"),
    [
        (["parallelism=data", "parallelism.tp.degree=2"], (1, 2, 0, 2)),
        (["parallelism=fsdp", *PP2], (2, 2, 2, 1)),
        (
            ["parallelism=pipeline", *PP2, "parallelism.tp.degree=2", "parallelism.tp.sequence_parallel=true"]
            + ["model.activation_checkpointing=true"],
            (2, 1, 0, 2),
        ),
    ],
    ids=["tp2-x-ddp-replicas", "pp2-x-fsdp2", "pp2-x-tp2-sequence-parallel-recompute"],
)
def test_two_dimensions_of_the_mesh_equal_one_rank(
    tmp_path: Path, lm_one_rank: tuple[Path, dict], extra: list[str], mesh: tuple[int, int, int, int]
) -> None:
    """(stages, data-parallel replicas, shard degree, tp degree) on 4 ranks."""
    run, s = run_ok(tmp_path, "mesh", *TINY_LM, *GLOBAL_32, *extra, "cluster.ranks=4")
    assert_same_weights(lm_one_rank[0], run, rtol=1e-5, atol=1e-6)
    stages, replicas, shard, tp = mesh
    assert (flat(s)["stages"], flat(s)["shard_degree"], flat(s)["tp_degree"]) == (stages, shard, tp), s
    assert s["world_size"] // stages // tp == replicas
