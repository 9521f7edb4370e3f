"""The parallelism axis before anything runs: which rank holds which stage, where models are cut,
and the invalid combinations, each refused naming the key, the rule and the fix."""

from __future__ import annotations

import pytest

from hpctrain.config import load_config
from hpctrain.config.layout import Layout, describe, placements
from hpctrain.config.split import evenly, split_points
from hpctrain.errors import ConfigError
from hpctrain.facts import HostFacts
from hpctrain.orchestrate.validate import validate
from hpctrain.parallel import layout_of, resolve_batch


def test_a_stages_replicas_are_consecutive_ranks_on_one_node() -> None:
    lay = Layout(stages=2, replicate=2)
    assert [(p.rank, p.node, p.stage, p.replica) for p in placements(lay, ranks_per_node=2)] == [
        (0, 0, 0, 0),
        (1, 0, 0, 1),
        (2, 1, 1, 0),
        (3, 1, 1, 1),
    ]
    assert lay.replica_ranks(1) == [2, 3] and lay.pipeline_ranks(1) == [1, 3]
    assert describe(lay, 2) == [
        "node 0: rank 0: stage 0 replica 0, rank 1: stage 0 replica 1",
        "node 1: rank 2: stage 1 replica 0, rank 3: stage 1 replica 1",
    ]


def test_a_dimension_a_package_adds_sits_between_the_shards_and_the_tensor_ranks() -> None:
    """A named dimension (context parallelism's "cp") in TorchTitan's order pp, replicate, shard,
    cp, tp: 2 stages x 2 shards x cp 2 x tp 2 = 16 ranks, rank r = ((stage*2 + shard)*2 + cp)*2 + tp.
    The ranks along cp read the same samples, run their own pipelines and average gradients with
    the stage's shards."""
    lay = Layout(stages=2, shard=2, tp=2, dims={"cp": 2})
    assert lay.world_size == 16 and lay.inner == 2
    assert [d for d, _ in lay.mesh_dims] == ["pp", "replicate", "shard", "cp", "tp"]
    # rank 13 = ((1*2 + 1)*2 + 0)*2 + 1: stage 1, shard 1, cp 0, tp 1
    assert (lay.stage_of(13), lay.shard_of(13), lay.dim_of("cp", 13), lay.tp_of(13)) == (1, 1, 0, 1)
    assert lay.replica_of(13) == lay.replica_of(15) == 1 and lay.dim_of("cp", 15) == 1  # same samples
    assert lay.pipeline_of(13) == [5, 13] and lay.pipeline_of(15) == [7, 15]
    assert lay.replica_ranks(1) == [8, 10, 12, 14]  # tp rank 0 of each shard and cp position
    assert {hash(lay), hash(Layout(stages=2, shard=2, tp=2, dims={"cp": 2}))} == {hash(lay)}
    assert Layout() == Layout(dims={}) and Layout().inner == 1


def test_interleaved_pieces_loop_over_the_stages() -> None:
    lay = Layout(stages=2, virtual=2)
    assert lay.pieces == 4 and lay.pieces_of(0) == [0, 2] and lay.pieces_of(1) == [1, 3]


def test_zbv_pieces_make_a_v_and_interleaved_zb_takes_virtual_stages() -> None:
    base = ["model=mlp", "model.depth=8", "parallelism=pipeline", "cluster.ranks=4", "parallelism.stages=4"]
    zbv = layout_of(load_config([*base, "parallelism.schedule=zbv"]), 4)
    assert zbv.pieces == 8 and [zbv.pieces_of(r) for r in range(4)] == [[0, 7], [1, 6], [2, 5], [3, 4]]
    zb = layout_of(
        load_config([*base, "parallelism.schedule=interleaved_zb", "parallelism.virtual_stages=2"]), 4
    )
    assert zb.pieces == 8 and zb.pieces_of(1) == [1, 5] and not zb.v_shape


def test_split_points_are_spread_evenly_over_the_declared_ones() -> None:
    # 5 candidates make 6 segments: 2 pieces cut after segment 3, 3 pieces after 2 and 4
    pts = ["a", "b", "c", "d", "e"]
    assert evenly(pts, 2) == ["c"] and evenly(pts, 3) == ["b", "d"] and evenly(pts, 6) == pts
    cfg = load_config(["model=mlp", "model.depth=4", "parallelism=pipeline", "cluster.ranks=2"])
    assert split_points(cfg, 2) == ["net.3"]  # blocks net.1..net.4, head net.5: 2 + 2 blocks and head
    cfg = load_config(["parallelism=pipeline", "parallelism.split_at=[features.3]", "cluster.ranks=2"])
    assert split_points(cfg, 2) == ["features.3"]


def test_a_pipelines_batch_is_per_replica() -> None:
    cfg = load_config(
        ["parallelism=hybrid", "cluster.ranks=4", "train.batch_per_rank=null", "train.global_batch=64"]
    )
    b = resolve_batch(cfg)
    assert layout_of(cfg, 4) == Layout(stages=2, replicate=2)
    assert (b.per_rank, b.global_, b.micro) == (32, 64, 8)  # 2 replicas; 4 micro-batches each


VALID = [
    ["parallelism=pipeline", "cluster.ranks=2"],
    ["parallelism=hybrid", "cluster.ranks=4", "parallelism.engine=ddp"],
    ["parallelism=hybrid", "cluster.ranks=2"],  # 1 replica: a study over replicas may start there
    ["parallelism=pipeline", "cluster.ranks=2", "parallelism.schedule=1f1b"],
    [
        "parallelism=pipeline",
        "cluster.ranks=2",
        "parallelism.schedule=interleaved_1f1b",
        "parallelism.virtual_stages=2",
        "model=mlp",
        "model.depth=4",
    ],
    ["model=mlp", "model.activation_checkpointing=true"],
    ["parallelism=pipeline", "cluster.ranks=2", "parallelism.schedule=interleaved_zb"],
    ["parallelism=pipeline", "cluster.ranks=2", "parallelism.schedule=zbv", "model=mlp", "model.depth=4"],
    ["parallelism=hybrid", "cluster.ranks=4", "parallelism.schedule=zbv", "model=mlp", "model.depth=4"],
]


@pytest.mark.parametrize("overrides", VALID, ids=[" ".join(o) for o in VALID])
def test_valid_layouts_pass(overrides: list[str]) -> None:
    validate(load_config(overrides), HostFacts.example())


INVALID = [
    # (overrides, key, words of the rule)
    (["parallelism=pipeline", "cluster.ranks=3"], "parallelism.stages", "not a multiple of 2 stages"),
    (["parallelism=pipeline", "cluster.ranks=4"], "parallelism.stages", "one rank per stage"),
    (
        ["parallelism=pipeline", "cluster.ranks=2", "parallelism.stages=1", "cluster.ranks=1"],
        "parallelism.stages",
        "at least 2 stages",
    ),
    (
        ["parallelism=pipeline", "cluster.ranks=2", "parallelism.microbatches=3"],
        "parallelism.microbatches",
        "do not divide",
    ),
    (
        [
            "parallelism=pipeline",
            "cluster.ranks=4",
            "parallelism.stages=4",
            "model=mlp",
            "model.depth=4",
            "parallelism.schedule=1f1b",
            "parallelism.microbatches=2",
        ],
        "parallelism.microbatches",
        "microbatches >= stages",
    ),
    (
        ["parallelism=pipeline", "cluster.ranks=2", "parallelism.schedule=interleaved_1f1b"],
        "parallelism.virtual_stages",
        "several model pieces",
    ),
    (
        ["parallelism=pipeline", "cluster.ranks=2", "parallelism.virtual_stages=2"],
        "parallelism.virtual_stages",
        "only interleaved_1f1b",
    ),
    (
        [
            "parallelism=pipeline",
            "cluster.ranks=2",
            "parallelism.schedule=zbv",
            "parallelism.virtual_stages=2",
        ],
        "parallelism.virtual_stages",
        "zbv always gives each rank two, in a V",
    ),
    (
        [
            "parallelism=pipeline",
            "cluster.ranks=2",
            "parallelism.schedule=interleaved_zb",
            "train.batch_per_rank=30",
            "parallelism.microbatches=5",
        ],
        "parallelism.microbatches",
        "interleaved_zb runs micro-batches in 2 equal rounds",
    ),
    (
        [
            "parallelism=hybrid",
            "cluster.ranks=4",
            "parallelism.engine=ddp",
            "parallelism.schedule=zbv",
            "model=mlp",
            "model.depth=4",
        ],
        "parallelism.schedule",
        "gradient hooks do not see",
    ),
    (
        ["parallelism=pipeline", "cluster.ranks=4", "parallelism.stages=4"],
        "parallelism.stages",
        "at most 3 pieces",
    ),
    (
        ["parallelism=pipeline", "cluster.ranks=2", "parallelism.split_at=[features.3,head]"],
        "parallelism.split_at",
        "make 3 pieces",
    ),
    (
        ["parallelism=pipeline", "cluster.ranks=2", "parallelism.backward_passes_per_step=2"],
        "parallelism.backward_passes_per_step",
        "accumulates",
    ),
    (["parallelism=pipeline", "cluster.ranks=2", "precision=fp16"], "precision.name", "loss-scale"),
    (["parallelism.stages=2"], "parallelism.stages", "pipeline setting"),
    (["parallelism.schedule=1f1b"], "parallelism.schedule", "pipeline setting"),
    (["model.checkpoint_blocks=[features]"], "model.checkpoint_blocks", "declares its own"),
]


@pytest.mark.parametrize("overrides,key,rule", INVALID, ids=[" ".join(o) for o, _, _ in INVALID])
def test_invalid_layouts_are_refused_before_anything_starts(
    overrides: list[str], key: str, rule: str
) -> None:
    with pytest.raises(ConfigError) as e:
        validate(load_config(overrides), HostFacts.example())
    problem = next((p for p in e.value.problems if p.key == key), None)
    assert problem is not None, str(e.value)
    assert rule in problem.rule and problem.fix, str(problem)
