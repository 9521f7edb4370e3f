"""Layouts that compose (degrees over one mesh: pipeline x replicas x shards x tensor), at plan
time and in their pure parts: the layout and each rank's place in it, the chain a pipeline of
sharded or split stages is cut along (and that its pieces compute the whole model), the rules,
the summary's title, the optimizer state keyed by parameter name."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hpctrain.commands.ui import mesh_text
from hpctrain.config import load_config
from hpctrain.config.layout import describe_mesh
from hpctrain.config.split import chain_pieces, declared_chain, split_points
from hpctrain.errors import ConfigError
from hpctrain.orchestrate.validate import validate
from hpctrain.parallel.registry import derive
from hpctrain.records import Layout, RunSummary
from hpctrain.train.checkpoint import by_index, unflatten
from tests.conftest import replace_summary
from tests.unit.test_parallel_plan import test_invalid_layouts_are_refused_before_anything_starts as refused

LM = ["model=transformer", "data=tokens", "parallelism.engine=ddp", "model.depth=2"]
THREE_D = [*LM, "parallelism=fsdp", "parallelism.stages=2", "parallelism.microbatches=2"]
THREE_D += ["parallelism.tp.degree=2", "cluster.ranks=8"]


def test_the_3d_layout_is_stage_then_shard_then_tensor_rank() -> None:
    cfg = load_config(THREE_D)
    d = derive(cfg)
    assert d.layout == Layout(stages=2, replicate=1, shard=2, tp=2)
    assert (d.batch.per_rank, d.batch.micro) == (32, 16)  # 2 replicas (the shards) of the batch of 64
    # rank 5 = stage 1, shard 0, tensor rank 1: its pipeline runs through tensor rank 1 of each stage
    assert [d.layout.pipeline_of(r) for r in (0, 1, 5, 7)] == [[0, 4], [1, 5], [1, 5], [3, 7]]
    assert [d.layout.replica_of(r) for r in range(8)] == [0, 0, 1, 1, 0, 0, 1, 1]
    assert describe_mesh(d.layout, 4) == [
        "node 0: rank 0: stage 0: tp 0/2 of shard 0/2, rank 1: stage 0: tp 1/2 of shard 0/2, "
        "rank 2: stage 0: tp 0/2 of shard 1/2, rank 3: stage 0: tp 1/2 of shard 1/2",
        "node 1: rank 4: stage 1: tp 0/2 of shard 0/2, rank 5: stage 1: tp 1/2 of shard 0/2, "
        "rank 6: stage 1: tp 0/2 of shard 1/2, rank 7: stage 1: tp 1/2 of shard 1/2",
    ]
    tp_ddp = derive(load_config([*LM, "parallelism.tp.degree=2", "cluster.ranks=4"])).layout
    assert tp_ddp == Layout(replicate=2, tp=2)  # TP with replicas, no longer refused
    pp_tp = derive(load_config([*LM, "parallelism=hybrid", *THREE_D[5:8], "cluster.ranks=8"])).layout
    assert pp_tp == Layout(stages=2, replicate=2, tp=2)


def test_the_chain_cut_at_the_split_points_computes_the_whole_model() -> None:
    from hpctrain.train.materialize import replayable
    from hpctrain.train.modules import ChainPiece
    from hpctrain.train.parts import make_model

    cfg = load_config([*LM, "data.seq_len=8", "data.vocab_size=32", "model.width=16", "model.heads=2"])
    chain = declared_chain(cfg.model)
    assert chain == ["embed", "blocks.layers.0", "blocks.layers.1", "norm", "head"]
    assert chain_pieces(chain, split_points(cfg, 2)) == [
        ["embed", "blocks.layers.0"],
        ["blocks.layers.1", "norm", "head"],
    ]
    assert declared_chain(load_config(["model=mlp", "model.depth=2"]).model) == [f"net.{i}" for i in range(4)]
    assert declared_chain(load_config(["model=cnn"]).model) == []  # flatten is a function, not a module
    torch.manual_seed(0)
    whole = make_model(cfg)
    assert replayable(whole)
    pieces = [ChainPiece(whole, names) for names in chain_pieces(chain, split_points(cfg, 2))]
    x = torch.randint(0, 32, (3, 8))
    assert torch.equal(pieces[1](pieces[0](x)), whole(x))
    # the pieces' state dicts are the whole model's, split: checkpoints and plans name them alike
    names = [k for p in pieces for k in p.state_dict()]
    assert sorted(names) == sorted(whole.state_dict()) and len(names) == len(set(names))


@pytest.mark.parametrize(
    ("overrides", "key", "rule"),
    [
        (
            [*LM, "parallelism=fsdp", "parallelism.stages=2", "parallelism.schedule=zbv", "cluster.ranks=4"],
            "parallelism.schedule",
            "which sharded stages do not take",
        ),
        (
            [
                "model=cnn",
                "parallelism.engine=ddp",
                "parallelism=fsdp",
                "parallelism.stages=2",
                "cluster.ranks=4",
            ],
            "parallelism.stages",
            "model cnn does not declare one",
        ),
        (
            [*LM, "parallelism=fsdp", "parallelism.stages=3", "cluster.ranks=4"],
            "parallelism.stages",
            "4 ranks are not a multiple of 3 stages",
        ),
    ],
    ids=["split-backward", "no-chain", "stages-do-not-divide"],
)
def test_a_composed_layout_that_cannot_work_is_refused_naming_the_rule(
    overrides: list[str], key: str, rule: str
) -> None:
    refused(overrides, key, rule)


def test_whole_checkpoints_are_refused_for_sharded_pipeline_stages(tmp_path: Path) -> None:
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "step-000004.pt").write_bytes(b"")
    with pytest.raises(ConfigError) as e:
        validate(load_config([*THREE_D, f"train.resume_from={tmp_path}"]))
    assert "holds whole-model checkpoints (.pt), which sharded or tensor-parallel pipeline" in str(e.value)


def _summary(world: int, stages: int, shard: int, tp: int) -> RunSummary:

    from hpctrain.records import read

    s = read(Path(__file__).parents[1] / "fixtures/runs/digits-2ranks/summary.json", RunSummary)
    return replace_summary(s, world_size=world, stages=stages, shard_degree=shard, tp_degree=tp)


def test_the_summary_title_names_the_mesh() -> None:
    assert mesh_text(_summary(4, 1, 0, 1)) == ""
    assert mesh_text(_summary(8, 2, 2, 2)) == " · 2 stages x 2 replica(s) (2 shards) x tp 2"
    assert mesh_text(_summary(4, 1, 0, 2)) == " · 2 replica(s) x tp 2"
    assert mesh_text(_summary(4, 2, 0, 1)) == " · 2 stages x 2 replica(s)"


def test_an_optimizer_state_keyed_by_name_is_read_back_by_index() -> None:
    flat = {
        "state.b.momentum_buffer": 2,
        "state.a.w.momentum_buffer": 1,
        "param_groups.a.w.lr": 0.1,
        "param_groups.a.w.momentum": 0.9,
        "param_groups.b.lr": 0.1,
        "param_groups.b.momentum": 0.9,
    }
    osd = unflatten(flat, ["a.w", "b"])
    assert osd == {
        "state": {"b": {"momentum_buffer": 2}, "a.w": {"momentum_buffer": 1}},
        "param_groups": [{"lr": 0.1, "momentum": 0.9, "params": ["a.w", "b"]}],
    }
    assert by_index(osd, ["a.w", "b"])["param_groups"][0]["params"] == [0, 1]
    two = unflatten({**flat, "param_groups.b.lr": 0.2}, ["a.w", "b"])["param_groups"]
    assert [g["params"] for g in two] == [["a.w"], ["b"]]  # different hyperparameters: two groups


@pytest.mark.parametrize("flat", [True, False], ids=["by-name", "param-groups-by-index (before 2026-11-28)"])
def test_a_sharded_checkpoint_of_either_optimizer_layout_loads(tmp_path: Path, flat: bool) -> None:
    """shard_checkpoint.save writes the optimizer keyed by parameter name (a pipeline's ranks hold
    different parameters); a checkpoint written before, with param_groups by index, still loads."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    from hpctrain.train.dcp_read import read_metadata
    from hpctrain.train.shard_checkpoint import flat_optimizer, load_sharded

    def trained() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
        o = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
        m(torch.ones(2, 4)).sum().backward()
        o.step()
        return m, o

    m, o = trained()
    msd, osd = get_state_dict(m, o, options=StateDictOptions(flatten_optimizer_state_dict=flat))
    path = tmp_path / "step-000001.dcp"
    dcp.save(
        {"model": msd, "optimizer": osd, "step": 1, "torch_rng": torch.get_rng_state()}, checkpoint_id=path
    )
    assert flat_optimizer(read_metadata(path)) is flat
    fresh = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    opt = torch.optim.SGD(fresh.parameters(), lr=0.1, momentum=0.9)
    assert load_sharded(path, fresh, opt) == 1
    assert all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), m.state_dict().values()))
    mine = [opt.state[p]["momentum_buffer"] for p in fresh.parameters()]
    theirs = [o.state[p]["momentum_buffer"] for p in m.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(mine, theirs))


def test_an_estimate_matches_its_own_probe_whatever_the_layout(tmp_path: Path) -> None:
    """--estimate of a 3-D (or any tensor-parallel or pipeline) layout compares the probe's
    samples per rank with the point's as the summary counts them (global batch / world), not per
    replica: the probe at the same scale is the measurement (it was 'cannot extrapolate')."""
    from hpctrain.facts import HostFacts
    from hpctrain.launch.local.plan import plan_local
    from hpctrain.orchestrate.estimate import Point, target_of

    cfg = load_config(THREE_D)
    t = target_of(Point("3d", cfg, plan_local(cfg, HostFacts.example(), str(tmp_path), "python")))
    assert (t.n, t.batch_per_rank) == (8, 64 / 8)  # 2 replicas of 32: 8 samples per rank
