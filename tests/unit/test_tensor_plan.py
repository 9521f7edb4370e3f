"""Tensor parallelism before anything runs: the layout (which rank holds which slice on which
node), the built-in models' plans, wildcards over repeated blocks, and every refusal naming the
key, the rule and the fix (exit 2 from the CLI)."""

from __future__ import annotations

import pytest
from torch import nn

from hpctrain.config import load_config
from hpctrain.config.layout import describe_mesh
from hpctrain.errors import ConfigError
from hpctrain.facts import HostFacts
from hpctrain.orchestrate.validate import validate
from hpctrain.parallel import layout_of, parallel_notes, resolve_batch
from hpctrain.parallel.tensor.plan import declared_tp_plan, resolve
from hpctrain.parallel.tensor.split import TensorParallelError, check_plan
from hpctrain.records import Layout
from tests.unit.test_parallel_plan import (
    test_invalid_layouts_are_refused_before_anything_starts as assert_refused,
)

LM = ["model=transformer", "data=tokens", "parallelism.engine=ddp"]


def test_a_tensor_parallel_group_is_consecutive_ranks_inside_a_node() -> None:
    cfg = load_config(
        [
            *LM,
            "parallelism=hsdp",
            "parallelism.tp.degree=2",
            "cluster=slurm",
            "cluster.nodes=2",
            "cluster.ranks_per_node=4",
        ]
    )
    lay = layout_of(cfg)  # hsdp's default shard group: one node's 4 ranks / tp 2
    assert lay == Layout(replicate=2, shard=2, tp=2) and lay.replicas == 4
    assert [lay.tp_of(r) for r in range(8)] == [0, 1] * 4
    assert [lay.replica_of(r) for r in range(8)] == [0, 0, 1, 1, 2, 2, 3, 3]  # a TP group reads one slice
    assert describe_mesh(lay, 4) == [
        "node 0: rank 0: tp 0/2 of shard 0/2 of group 0, rank 1: tp 1/2 of shard 0/2 of group 0, "
        "rank 2: tp 0/2 of shard 1/2 of group 0, rank 3: tp 1/2 of shard 1/2 of group 0",
        "node 1: rank 4: tp 0/2 of shard 0/2 of group 1, rank 5: tp 1/2 of shard 0/2 of group 1, "
        "rank 6: tp 0/2 of shard 1/2 of group 1, rank 7: tp 1/2 of shard 1/2 of group 1",
    ]
    validate(cfg)


def test_pure_tensor_parallelism_is_one_replica_reading_the_whole_batch() -> None:
    cfg = load_config([*LM, "parallelism.tp.degree=2", "cluster.ranks=2", "train.batch_per_rank=8"])
    assert layout_of(cfg) == Layout(tp=2)
    b = resolve_batch(cfg)
    assert (b.per_rank, b.global_) == (8, 8)  # both ranks read the same 8 samples
    notes = parallel_notes(cfg, layout_of(cfg), 2)
    assert notes[0].startswith("tensor parallel: groups of 2 consecutive ranks split embed.tok: rowwise")
    validate(cfg, HostFacts.example())


def test_the_built_in_plans_pair_columns_with_rows() -> None:
    mlp = load_config(["model=mlp", "model.depth=4"]).model
    assert declared_tp_plan(mlp) == {
        "net.1.0": "colwise",
        "net.2.0": "rowwise",
        "net.3.0": "colwise",
        "net.4.0": "rowwise",
    }
    one = load_config(["model=mlp", "model.depth=1"]).model
    assert declared_tp_plan(one) == {"net.1.0": "colwise", "net.2": "rowwise"}  # the head closes the pair
    lm = load_config(["model=transformer"]).model
    seq = declared_tp_plan(lm, sequence=True)
    assert seq.keys() - declared_tp_plan(lm).keys() == {
        "embed",
        "blocks.layers.*.norm1",
        "blocks.layers.*.attn",
        "blocks.layers.*.norm2",
        "blocks.layers.*.ffn",
        "norm",
    }
    assert declared_tp_plan(load_config(["model=cnn"]).model) == {}


def test_wildcards_span_the_repeated_blocks_and_unmatched_patterns_are_named() -> None:
    names = ["layers.0.w1", "layers.0.w2", "layers.1.w1", "layers.1.w2", "head"]
    found, unmatched = resolve({"layers.*.w1": "colwise", "layers.*.w2": "rowwise", "tail": "colwise"}, names)
    assert found == {
        "layers.0.w1": "colwise",
        "layers.1.w1": "colwise",
        "layers.0.w2": "rowwise",
        "layers.1.w2": "rowwise",
    }
    assert unmatched == ["tail"]


def test_a_plan_that_does_not_fit_a_user_model_is_named() -> None:
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    assert check_plan(model, {"0": "colwise", "2": "rowwise"}) == {"0": "colwise", "2": "rowwise"}
    with pytest.raises(TensorParallelError, match=r"\['3'\] name no module"):
        check_plan(model, {"3": "colwise"})
    with pytest.raises(TensorParallelError, match=r"\{'1': 'ReLU'\} are not Linear or Embedding"):
        check_plan(model, {"1": "colwise"})
    assert check_plan(model, {"1": "sequence"}) == {"1": "sequence"}  # a seam may be any module


INVALID = [
    ([*LM, "parallelism.tp.degree=3", "cluster.ranks=4"], "parallelism.tp.degree", "not a multiple of 3"),
    (
        ["model=transformer", "data=tokens", "parallelism.tp.degree=2", "cluster.ranks=2"],
        "parallelism.engine",
        "engine horovod cannot",
    ),
    (
        [*LM, "parallelism=fsdp", "parallelism.stages=2", "parallelism.schedule=zbv", "cluster.ranks=4"],
        "parallelism.schedule",
        "zbv splits the backward into input and weight gradients, which sharded stages do not take",
    ),
    (
        [*LM, "parallelism=fsdp", "parallelism.stages=3", "parallelism.tp.degree=2", "cluster.ranks=8"],
        "parallelism.stages",
        "4 ranks are not a multiple of 3 stages",  # the data-parallel ranks: 8 / tp 2
    ),
    (
        [*LM, "model.heads=3", "model.width=96", "parallelism.tp.degree=2", "cluster.ranks=2"],
        "model.heads",
        "does not split over 2",
    ),
    (
        ["parallelism.engine=ddp", "parallelism.tp.degree=2", "cluster.ranks=2"],
        "parallelism.tp.plan",
        "model cnn has no tensor-parallel plan",
    ),
    (
        [
            "parallelism.engine=ddp",
            "model=mlp",
            "parallelism.tp.degree=2",
            "cluster.ranks=2",
            "+parallelism.tp.plan={net.9: colwise}",
        ],
        "parallelism.tp.plan",
        "['net.9'] name no module",
    ),
    (
        [
            "parallelism.engine=ddp",
            "model=mlp",
            "parallelism.tp.degree=2",
            "cluster.ranks=2",
            "+parallelism.tp.plan={net.1.0: diagonal}",
        ],
        "parallelism.tp.plan.net.1.0",
        "not a tensor-parallel style",
    ),
    (
        [
            "parallelism.engine=ddp",
            "model=mlp",
            "parallelism.tp.degree=2",
            "cluster.ranks=2",
            "parallelism.tp.sequence_parallel=true",
        ],
        "parallelism.tp.sequence_parallel",
        "no sequence to split",
    ),
    ([*LM, "parallelism.tp.degree=2", "cluster.ranks=2", "precision=fp16"], "precision.name", "loss scale"),
    (
        ["parallelism=pipeline", "cluster.ranks=4", "parallelism.stages=2", "parallelism.tp.degree=2"],
        "parallelism.stages",
        "a pipeline of tensor-parallel stages is cut along a chain of modules",
    ),
    (
        [
            "parallelism=hybrid",
            "parallelism.engine=ddp",
            "model=mlp",
            "parallelism.stages=2",
            "cluster.ranks=8",
        ]
        + ["parallelism.tp.degree=2", "parallelism.split_at=[net.1]"],
        "parallelism.split_at",
        "['net.1'] are not places model mlp can be cut",
    ),
    ([*LM, "parallelism.tp.sequence_parallel=true"], "parallelism.tp.sequence_parallel", "tp.degree=1"),
]


@pytest.mark.parametrize("overrides,key,rule", INVALID, ids=[" ".join(o[-3:]) for o, _, _ in INVALID])
def test_invalid_tensor_parallel_layouts_are_refused_before_anything_starts(
    overrides: list[str], key: str, rule: str
) -> None:
    assert_refused(overrides, key, rule)  # the same check as the other layouts


def test_a_user_model_without_a_plan_is_refused() -> None:
    cfg = load_config(
        [
            "parallelism.engine=ddp",
            "parallelism.tp.degree=2",
            "cluster.ranks=2",
            "model._target_=torch.nn.Linear",
            "+model.in_features=4",
            "+model.out_features=2",
        ]
    )
    with pytest.raises(ConfigError, match="parallelism.tp.plan: your model has no tensor-parallel plan"):
        validate(cfg, HostFacts.example())


def test_the_documented_plan_syntax_composes_as_written() -> None:
    """Round 5, class 6: `parallelism.tp.plan='{...}'`, as the tensor-parallel page and the refusal
    for a model without a plan write it, was refused key by key ("unknown key"); a map is now
    assigned whole, and a bad style is refused by its rule."""
    import re
    import shlex
    from pathlib import Path

    page = (Path(__file__).parents[2] / "docs" / "howto" / "tensor-parallel.md").read_text()
    [written] = re.findall(r"`(parallelism\.tp\.plan='\{[^`]*\}')`", page)
    [override] = shlex.split(" ".join(written.split()))
    plan = load_config(["model=mlp", override]).parallelism.tp.plan
    assert plan == {
        "layers.*.attn.q": "colwise",
        "layers.*.attn.o": "rowwise",
        "layers.*.mlp.up": "colwise",
        "layers.*.mlp.down": "rowwise",
        "head": "colwise_gather",
    }
    cfg = load_config(
        [
            "model=mlp",
            "parallelism.engine=ddp",
            "parallelism.tp.degree=2",
            "cluster.ranks=2",
            "parallelism.tp.plan={layers.*.up: sideways}",
        ]
    )
    with pytest.raises(ConfigError, match="'sideways' is not a tensor-parallel style"):
        validate(cfg)
    for key, value in (("cluster.env", '{A: "1"}'), ("model.kwargs", "{hidden: 8}")):
        assert load_config([f"{key}={value}"]) is not None  # every map of the schema alike
