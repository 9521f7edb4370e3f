"""Sweep expansion with Hydra's grammar, and grouping of points by resource shape."""

from __future__ import annotations

import pytest

from hpctrain.config import load_config
from hpctrain.errors import ConfigError
from hpctrain.launch.base import RunSpec
from hpctrain.launch.slurm.plan import plan_slurm
from hpctrain.launch.slurm.submit import group_by_shape
from hpctrain.orchestrate.sweep import expand


def test_cartesian_product_in_hydra_order() -> None:
    points = expand(["cluster=slurm", "cluster.nodes=1,2", "precision=fp32,bf16,fp16"])
    assert len(points) == 6
    assert points[0] == ["cluster=slurm", "cluster.nodes=1", "precision=fp32"]
    assert points[-1] == ["cluster=slurm", "cluster.nodes=2", "precision=fp16"]


def test_range_and_single_values() -> None:
    assert expand(["train.seed=range(3)"]) == [["train.seed=0"], ["train.seed=1"], ["train.seed=2"]]
    assert expand(["train.steps=5"]) == [["train.steps=5"]]


def test_bad_sweep_syntax_is_a_config_error() -> None:
    with pytest.raises(ConfigError):
        expand(["train.seed=range(1,"])


def test_points_group_into_one_array_per_shape() -> None:
    points = expand(["cluster=slurm", "cluster.nodes=1,2", "precision=fp32,bf16,fp16"])
    planned = [
        RunSpec(i, p, c := load_config(p), plan_slurm(c, f"/s/{i}", "py", "/s/submitit"))
        for i, p in enumerate(points)
    ]
    groups = group_by_shape(planned)
    assert sorted(len(g) for g in groups) == [3, 3]
    for g in groups:
        assert len({p.cfg.cluster.nodes for p in g}) == 1


def test_an_invalid_sweep_point_is_named_with_what_varies() -> None:
    from hpctrain.orchestrate.runs import prepare

    with pytest.raises(ConfigError) as e:
        prepare(["data=digits", "cluster.ranks=1,0", "precision=fp32,bf16"], multirun=True)
    [problem] = e.value.problems  # one rule, broken by two points
    assert problem.key == "cluster.ranks"
    assert (
        problem.where == "point 2 (cluster.ranks=0 precision=fp32), point 3 (cluster.ranks=0 precision=bf16)"
    )
    assert "in: point 2" in str(e.value)


def test_glob_over_a_config_group_lists_its_options_as_in_hydra() -> None:
    assert expand(["model=glob(*)"]) == [
        [f"model={m}"] for m in ("cnn", "mlp", "resnet18", "resnet50", "transformer")
    ]
    assert expand(["model=glob(res*)", "precision=glob(*,exclude=fp16)"]) == [
        ["model=resnet18", "precision=bf16"],
        ["model=resnet18", "precision=fp32"],
        ["model=resnet50", "precision=bf16"],
        ["model=resnet50", "precision=fp32"],
    ]


def test_tables_show_the_shared_overrides_once_and_per_row_only_what_varies() -> None:
    from hpctrain.orchestrate.sweep import split_common

    points = [
        ["cluster=slurm", "cluster.nodes=1", "precision=fp32", "train.steps=50"],
        ["cluster=slurm", "cluster.nodes=1", "precision=bf16", "train.steps=50"],
        ["cluster=slurm", "cluster.nodes=2", "precision=fp32", "train.steps=50"],
    ]
    common, varying = split_common(points)
    assert common == ["cluster=slurm", "train.steps=50"]
    assert varying == [
        ["cluster.nodes=1", "precision=fp32"],
        ["cluster.nodes=1", "precision=bf16"],
        ["cluster.nodes=2", "precision=fp32"],
    ]
    assert split_common([["a=1"]]) == (["a=1"], [[]])  # one point: nothing varies
    assert split_common([]) == ([], [])


def test_status_puts_what_needs_attention_first() -> None:
    from hpctrain.orchestrate.sweep import state_rank

    states = ["COMPLETED", "PENDING", "RUNNING", "FAILED", "CANCELLED by 0", "TIMEOUT", "COMPLETED"]
    assert sorted(states, key=state_rank) == [
        "FAILED",
        "CANCELLED by 0",
        "TIMEOUT",
        "RUNNING",
        "COMPLETED",
        "PENDING",
        "COMPLETED",
    ]
