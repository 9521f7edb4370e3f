"""Context parallelism before anything runs (parallel/context/): which tokens a rank holds and
that the causal work balances, the gathered attention against one rank's (one process: the
exchange done by hand), the layout and its mesh, the schema's new keys, every refusal naming the
key, the rule and the fix, the memory it predicts, and its row of a summary."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from hpctrain.config import load_config
from hpctrain.errors import ConfigError
from hpctrain.facts import HostFacts
from hpctrain.orchestrate.validate import validate
from hpctrain.parallel import layout_of, parallel_notes, resolve_batch
from hpctrain.parallel.context.attention import ContextError, causal_mask
from hpctrain.parallel.context.figures import ContextFigures
from hpctrain.parallel.context.report import report_rows
from hpctrain.parallel.context.settings import cp_settings
from hpctrain.parallel.context.side import ContextSide, group_ranks
from hpctrain.parallel.context.zigzag import gathered_positions, positions, take
from hpctrain.records import Layout
from hpctrain.records.parts import Parts
from tests.unit.test_parallel_plan import (
    test_invalid_layouts_are_refused_before_anything_starts as assert_refused,
)

LM = ["model=transformer", "data=tokens", "parallelism.engine=ddp"]


def test_rank_i_holds_chunks_i_and_2n_minus_1_minus_i_and_the_causal_work_balances() -> None:
    assert positions(8, 2, 0).tolist() == [0, 1, 6, 7]
    assert positions(8, 2, 1).tolist() == [2, 3, 4, 5]
    assert positions(16, 4, 1).tolist() == [2, 3, 12, 13]
    assert gathered_positions(8, 2).tolist() == [0, 1, 6, 7, 2, 3, 4, 5]
    assert take(torch.arange(8)[None], 2, 0, 1).tolist() == [[0, 1, 6, 7]]
    # the keys each rank's queries see under the causal mask: equal work (a plain split: 10 and 26)
    seen = [int(causal_mask(8, 2, i).sum()) for i in range(2)]
    assert seen == [18, 18] and sum(seen) == 8 * 9 // 2
    assert [int(causal_mask(16, 4, i).sum()) for i in range(4)] == [34] * 4


def test_gathered_attention_equals_one_ranks_causal_attention() -> None:
    """Each rank's queries over the K and V gathered from every rank (in rank order), under the
    mask of their true positions, are one rank's causal attention at those positions."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 16, 4, dtype=torch.float64) for _ in range(3))
    whole = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    for n in (2, 4):
        keys = torch.cat([take(k, n, r, 2) for r in range(n)], dim=2)
        values = torch.cat([take(v, n, r, 2) for r in range(n)], dim=2)
        for i in range(n):
            mine = F.scaled_dot_product_attention(
                take(q, n, i, 2), keys, values, attn_mask=causal_mask(16, n, i)
            )
            torch.testing.assert_close(mine, take(whole, n, i, 2), rtol=1e-12, atol=1e-12)


def test_the_cp_ranks_sit_between_the_shards_and_the_tensor_parallel_ranks() -> None:
    cfg = load_config(
        [*LM, "parallelism=fsdp", "parallelism.cp.degree=2", "parallelism.tp.degree=2", "cluster.ranks=8"]
    )
    lay = layout_of(cfg)
    assert lay == Layout(shard=2, tp=2, dims={"cp": 2}) and lay.world_size == 8
    assert lay.mesh_dims == [("replicate", 1), ("shard", 2), ("cp", 2), ("tp", 2)]
    assert [lay.dim_of("cp", r) for r in range(8)] == [0, 0, 1, 1, 0, 0, 1, 1]
    assert group_ranks(lay, 5) == [5, 7] and group_ranks(lay, 0) == [0, 2]
    # the cp ranks read the same samples: 2 replicas of the global batch, not 4
    assert [lay.replica_of(r) for r in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert resolve_batch(cfg).per_rank * 2 == resolve_batch(cfg).global_
    notes = parallel_notes(cfg, lay, 8)
    assert notes[-1].startswith(
        "context parallel: each sample's sequence split over 2 ranks at blocks.layers.0"
    )
    validate(cfg, HostFacts.example())
    piped = layout_of(
        load_config(
            [*LM, "parallelism=fsdp", "parallelism.stages=2", "parallelism.cp.degree=2", "cluster.ranks=8"]
        )
    )
    assert (piped.stages, piped.replicate, piped.shard, piped.dims) == (2, 1, 2, {"cp": 2})
    assert layout_of(load_config([*LM, "parallelism.cp.degree=2", "cluster.ranks=4"])) == Layout(
        replicate=2, dims={"cp": 2}
    )


def test_the_schema_knows_parallelism_cp_and_refuses_a_key_it_does_not_have() -> None:
    cfg = load_config(
        [*LM, "parallelism.cp.degree=2", "parallelism.cp.split_at=blocks.layers.1", "cluster.ranks=2"]
    )
    assert (cp_settings(cfg).degree, cp_settings(cfg).split_at) == (2, "blocks.layers.1")
    with pytest.raises(ConfigError, match="parallelism.cp.bogus"):
        load_config([*LM, "parallelism.cp.bogus=1"])


@pytest.mark.parametrize(
    ("overrides", "key", "rule"),
    [
        ([*LM, "parallelism.cp.degree=0"], "parallelism.cp.degree", "must be >= 1"),
        ([*LM, "parallelism.cp.degree=2", "cluster.ranks=3"], "parallelism.cp.degree", "3 ranks are not a multiple of 2"),
        (["model=mlp", "parallelism.cp.degree=2", "cluster.ranks=2"], "parallelism.cp.degree", "has no sequence to split"),
        ([*LM, "data.seq_len=6", "parallelism.cp.degree=2", "cluster.ranks=2"], "data.seq_len", "do not cut into 4 equal chunks"),
        ([*LM, "parallelism.cp.degree=2", "parallelism.tp.degree=2", "parallelism.tp.sequence_parallel=true", "cluster.ranks=4"],
         "parallelism.tp.sequence_parallel", "already splits"),
        ([*LM, "parallelism=pipeline", "parallelism.stages=2", "parallelism.cp.degree=2", "cluster.ranks=4"],
         "parallelism.cp.degree", "does not compose"),
        (["model._target_=torch.nn.Identity", "data=tokens", "parallelism.cp.degree=2", "cluster.ranks=2"],
         "parallelism.cp.split_at", "is not named"),
    ],
    ids=["degree-0", "world", "no-sequence", "seq-len", "sequence-parallel", "pure-pipeline", "user-model-unnamed"],
)  # fmt: skip
def test_a_layout_context_parallelism_cannot_take_is_refused_naming_the_fix(
    overrides: list[str], key: str, rule: str
) -> None:
    assert_refused(overrides, key, rule)


def test_the_rank_refuses_attention_inside_multihead_attention_and_an_unknown_split() -> None:
    cfg = load_config([*LM, "parallelism.cp.degree=2", "cluster.ranks=2"])
    side = ContextSide(cfg, Layout(dims={"cp": 2}), 0)

    class Mha(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.Sequential(nn.MultiheadAttention(8, 2))

    with pytest.raises(
        ContextError, match=r"blocks\.0 computes attention without F\.scaled_dot_product_attention"
    ):
        side.wrap(Mha())
    with pytest.raises(ContextError, match="the model has no module 'blocks.layers.0'"):
        side.wrap(nn.Sequential(nn.Linear(2, 2)))
    with pytest.raises(ContextError, match=r"the targets are \(2, 6\)"):
        side.targets(torch.zeros(2, 6))


def test_cp2_predicts_activations_of_at_most_0_6_of_one_rank() -> None:
    """The memory trace follows the ranks' build (memory/trace.py): the same transformer and batch
    with each sample's sequence split over two ranks, and four."""
    from hpctrain.memory.trace import trace_rank
    from hpctrain.parallel import derive

    base = [
        *LM,
        "model.width=64",
        "model.heads=4",
        "data.seq_len=256",
        "train.batch_per_rank=null",
        "train.global_batch=8",
    ]
    act = {}
    for n in (1, 2, 4):
        cfg = load_config([*base, f"parallelism.cp.degree={n}", f"cluster.ranks={n}"])
        act[n] = trace_rank(cfg, derive(cfg), 0).parts["activations"]
    assert act[2] <= 0.6 * act[1] and act[4] <= 0.6 * act[2], act


def test_the_summary_row_says_what_the_exchange_costs_of_the_step() -> None:
    """A summary's context part reads back as its record (records/parts.py finds it by the package's
    name), and its row has the hand-computed cells."""
    from hpctrain import records
    from hpctrain.records.typed import to_dict
    from tests.unit.test_parts import _old

    f = ContextFigures(
        degree=2, split_at="blocks.layers.0", exchanges=4, kv_bytes=2**20, comm_s=0.003, share=0.3
    )
    raw = to_dict(records.from_dict(records.RunSummary, _old()))
    raw["parts"] = {"context": {"degree": 2, "split_at": "blocks.layers.0", "exchanges": 4, "kv_bytes": 2**20,
                                "comm_s": 0.003, "share": 0.3}}  # fmt: skip
    s = records.from_dict(records.RunSummary, raw)
    assert s.parts["context"] == f
    rows = report_rows(s)
    assert rows[0] == (
        "step",
        "context-parallel K/V exchange (alone)",
        "3.00 ms",
        "30.0% (4 collectives per step, 1.00 MiB)",
    )
    assert rows[1][0] == "advice" and "costs 30% of the step" in rows[1][1]
    calm = dataclasses.replace(s, parts=Parts(context=ContextFigures(degree=2, comm_s=0.001, share=0.1)))
    assert report_rows(calm)[1:] == []  # no advice below a quarter of the step
    assert f.mesh_dim() == (False, 2, "cp 2")


def test_a_studys_points_table_has_the_exchanges_share_of_the_step() -> None:
    from hpctrain.parallel.context.report import STUDY

    assert STUDY.columns == ("K/V exch.",)
    assert STUDY.cells({"kv_s": 0.002}, 0.010) == ["20.0%"]
    assert STUDY.cells({}, 0.010) == ["-"]  # a point without context parallelism
