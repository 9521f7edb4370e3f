"""Sharded data parallelism, planned without a rank: the mesh (which rank holds which shard on
which node), the batch, what is sharded, the study series, and the optimizer state moving between
the index-keyed (torch.optim) and name-keyed (torch.distributed.checkpoint) forms."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpctrain.config import load_config
from hpctrain.config.layout import Layout, describe_mesh
from hpctrain.config.split import shard_units
from hpctrain.errors import ConfigError
from hpctrain.facts import HostFacts
from hpctrain.orchestrate.study import expand_study
from hpctrain.orchestrate.validate import validate
from hpctrain.parallel import layout_of, parallel_notes, resolve_batch
from hpctrain.train.checkpoint import KEEP, by_index, by_name, candidates, prune
from tests.conftest import replace_summary


def test_hsdp_groups_are_one_nodes_consecutive_ranks() -> None:
    cfg = load_config(["parallelism=hsdp", "cluster=slurm", "cluster.nodes=2", "cluster.ranks_per_node=2"])
    mesh = layout_of(cfg)
    assert mesh == Layout(replicate=2, shard=2)
    assert describe_mesh(mesh, 2) == [
        "node 0: rank 0: shard 0/2 of group 0, rank 1: shard 1/2 of group 0",
        "node 1: rank 2: shard 0/2 of group 1, rank 3: shard 1/2 of group 1",
    ]
    validate(cfg)


def test_fsdp_shards_over_the_world_and_every_rank_reads_its_own_batch() -> None:
    cfg = load_config(
        ["parallelism=fsdp", "cluster.ranks=4", "train.batch_per_rank=null", "train.global_batch=64"]
    )
    assert layout_of(cfg) == Layout(shard=4)
    assert layout_of(cfg).replicas == 4  # one stage: each rank a slice of the global batch
    b = resolve_batch(cfg)
    assert (b.per_rank, b.global_, b.micro) == (16, 64, 16)
    notes = parallel_notes(cfg, layout_of(cfg), 4)
    assert notes[0].startswith("fsdp: mesh 1 replica group(s) x 4 shards; shards units features")
    validate(cfg, HostFacts.example())


def test_what_is_sharded() -> None:
    t = load_config(["model=transformer", "model.depth=3"]).model
    assert shard_units(t, []) == ["blocks.layers.0", "blocks.layers.1", "blocks.layers.2"]
    assert shard_units(t, ["TransformerEncoderLayer"]) == ["TransformerEncoderLayer"]
    user = load_config(
        ["model._target_=torch.nn.Linear", "+model.in_features=4", "+model.out_features=2"]
    ).model
    assert shard_units(user, []) == []  # a user model without names is one unit


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["study.parallelisms=[data,data]"], "study.parallelisms"),
        (["study.parallelisms=[]"], "study.parallelisms"),
        (["study.parallelisms=[zero3]"], "study.parallelisms[0]"),
        (["study.parallelisms=[data,zero3/tp2]"], "study.parallelisms[1]"),
        (["study.parallelisms=[fsdp/tp1]"], "study.parallelisms[0]"),
        (["study.parallelisms=[fsdp/x2]"], "study.parallelisms[0]"),
        (["study.parallelisms=[fsdp/tp2/tp2]"], "study.parallelisms[0]"),
        (["study.parallelisms=[fsdp/pp1]"], "study.parallelisms[0]"),
    ],
)
def test_bad_study_parallelisms_are_refused(overrides: list[str], key: str) -> None:
    with pytest.raises(ConfigError) as e:
        expand_study(load_config(["study=strong", *overrides]))
    assert key in [p.key for p in e.value.problems]


def test_a_study_compares_parallelisms_as_series() -> None:
    cfg = load_config(
        ["study=strong", "study.parallelisms=[data,fsdp]", "study.ranks=[1,2]", "study.repetitions=1"]
    )
    points = expand_study(cfg)
    assert [p.name for p in points] == ["data-n1-r0", "fsdp-n1-r0", "data-n2-r0", "fsdp-n2-r0"]
    assert points[1].overrides[0] == "parallelism=fsdp"  # the group first: the study's keys override it


def test_a_study_compares_tensor_parallel_layouts_as_series() -> None:
    """`group/tpN`: the group with tensor parallelism of degree N, a series of its own."""
    cfg = load_config(
        ["study=strong", "study.parallelisms=[fsdp,fsdp/tp2]", "study.ranks=[4]", "study.repetitions=1"]
    )
    fsdp, tp = expand_study(cfg)
    assert (fsdp.name, tp.name) == ("fsdp-n4-r0", "fsdp-tp2-n4-r0")  # a directory name: no '/'
    assert tp.overrides[:2] == ("parallelism=fsdp", "parallelism.tp.degree=2")
    assert "parallelism.tp.degree=2" not in fsdp.overrides


def test_a_study_compares_3d_layouts_as_series() -> None:
    """`group/ppN/tpN`: stages and tensor parallelism over one mesh (either order)."""
    cfg = load_config(
        ["model=transformer", "data=tokens", "parallelism.engine=ddp", "study=strong"]
        + ["study.parallelisms=[fsdp,fsdp/pp2/tp2,hsdp/tp2/pp2]", "study.ranks=[8]", "study.repetitions=1"]
        + ["study.microbatches=[2]", "parallelism.shard.degree=null"]
    )
    fsdp, three_d, hsdp = expand_study(cfg)
    assert three_d.name == "fsdp-pp2-tp2-m2-n8-r0"
    assert three_d.overrides[:3] == ("parallelism=fsdp", "parallelism.stages=2", "parallelism.tp.degree=2")
    assert hsdp.overrides[:3] == ("parallelism=hsdp", "parallelism.tp.degree=2", "parallelism.stages=2")


def test_tensor_parallel_runs_are_a_series_of_their_own() -> None:

    from hpctrain.analysis.analyze import analyze_runs
    from hpctrain.bench.analyze import synthetic_summary

    base = synthetic_summary(4, 64, step=0.05, compute=0.04, comm=0.005, data=0.005, engine="ddp")
    runs = [
        replace_summary(base, parallelism="fsdp"),
        replace_summary(base, parallelism="fsdp", tp_degree=2),
        replace_summary(base, parallelism="data"),
    ]
    assert [s.label for s in analyze_runs("strong", runs, []).series] == [
        "fsdp ddp",
        "fsdp tp=2 ddp",
        "data ddp",
    ]
    piped = replace_summary(base, parallelism="fsdp", stages=2, shard_degree=2, tp_degree=2)
    pipeline = replace_summary(base, parallelism="pipeline", stages=4)  # its stages grow with the scale
    assert [s.label for s in analyze_runs("strong", [piped, pipeline], []).series] == [
        "fsdp pp=2 tp=2 ddp",
        "pipeline ddp",
    ]


def test_optimizer_state_by_name_and_back() -> None:
    names = ["a.weight", "a.bias", "b.weight"]
    osd = {"state": {0: {"m": 1}, 2: {"m": 3}}, "param_groups": [{"lr": 0.1, "params": [0, 1, 2]}]}
    named = by_name(osd, names)
    assert named == {
        "state": {"a.weight": {"m": 1}, "b.weight": {"m": 3}},
        "param_groups": [{"lr": 0.1, "params": names}],
    }
    assert by_index(named, names) == osd


def test_pruning_keeps_the_newest_of_either_format_and_drops_partial_saves(tmp_path: Path) -> None:
    d = tmp_path / "checkpoints"
    d.mkdir()
    for step in (2, 4):
        (d / f"step-{step:06d}.pt").write_bytes(b"x")
    (d / "step-000006.dcp").mkdir()
    (d / "step-000006.dcp" / ".metadata").write_bytes(b"x")
    (d / ".step-000008.dcp").mkdir()  # a killed save
    prune(d)
    assert sorted(p.name for p in d.iterdir()) == ["step-000004.pt", "step-000006.dcp"][-KEEP:]
    (tmp_path / "checkpoints" / "latest").write_text("step-000006.dcp\n")
    found, notes = candidates(tmp_path)
    assert [p.name for p in found] == ["step-000006.dcp", "step-000004.pt"] and notes == []


def test_fsdps_roofline_is_one_and_a_half_allreduces() -> None:
    from hpctrain.analysis.model import CommModel
    from hpctrain.analysis.roofline import roofline

    comm = CommModel(alpha_s=1e-5, beta_s_per_byte=1e-9)
    ddp = roofline("ddp", "fusion", 4, 8e6, 8e6, 10, comm, 0.0)
    fsdp = roofline("ddp", "shards", 4, 8e6, 0, 5, comm, 0.0)
    assert ddp is not None and fsdp is not None
    assert fsdp.messages == 5 and ddp.messages == 1
    # bytes: 3 (n-1)/n m beta against 2 (n-1)/n m beta
    assert (
        fsdp.bandwidth_s
        == pytest.approx(1.5 * ddp.bandwidth_s)
        == pytest.approx(1.5 * 2 * 3 / 4 * 8e6 * 1e-9)
    )
    assert "reshard_after_forward=false" in fsdp.knob
