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


@pytest.mark.parametrize(
    ("sweep", "said"),
    [
        (["train.seed=choice(1,choice(2,3))"], "train.seed: a choice cannot hold another sweep"),
        (["model=glob(zzz*)"], "model=glob(zzz*) matches none of the options of model (cnn, mlp,"),
        (
            ["train.seed=range(0,10,0)"],
            "train.seed: range(start, stop[, step]) needs a start, a stop and a step that is not 0",
        ),
        (["train.seed=range(5,0)"], "train.seed lists no values, so the sweep has no points"),
        (["optim.lr=interval(0,1)"], "optim.lr: interval_sweep cannot be enumerated"),
        (["train.seed=range(0,100000000)"], "100000000 points exceed the limit of 100000"),
        (["optim.lr=range(0,1,0.0000001)"], "10000001 points exceed the limit of 100000"),
        (["train.seed=range(0,1000)", "optim.lr=range(0,1,0.01)", "model=glob(*)"], "500000 points exceed"),
    ],
)
def test_sweeps_are_counted_before_they_are_listed(
    sweep: list[str], said: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Refused without listing a point: before counting, a range of 10^8 took 8 GB and minutes to
    list, and these syntax errors were reported as bugs in hpctrain."""
    from hpctrain.orchestrate import sweep as module

    def listed(*_: object) -> None:
        raise AssertionError("the sweep was listed before it was counted")

    monkeypatch.setattr(module.BasicSweeper, "split_arguments", staticmethod(listed))
    with pytest.raises(ConfigError) as e:
        expand(sweep)
    assert said in str(e.value)


def test_hydra_counts_floats_as_it_lists_them() -> None:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from hpctrain.orchestrate.sweep import count

    for s in [
        "optim.lr=range(0,1,0.1)",
        "optim.lr=range(0.5,-1,-0.25)",
        "train.seed=range(3,30,7)",
        "a=1,2,3",
    ]:
        assert count(OverridesParser.create().parse_overrides([s])) == len(
            expand([s]) if not s.startswith("a=") else [1, 2, 3]
        )


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


def test_a_sweeps_run_dir_is_its_directory_and_each_point_knows_its_own(tmp_path) -> None:
    """Before, run.dir=X swept into X-sweep while every point's config (and status) said X."""
    from hpctrain.orchestrate.runs import prepare

    p = prepare(["train.seed=1,2", f"run.dir={tmp_path / 'X'}", "data=digits"], multirun=True)
    assert p.group_dir == (tmp_path / "X").resolve()
    assert [r.cfg.run.dir for r in p.runs] == [str(p.group_dir / "0"), str(p.group_dir / "1")]
    assert [r.cfg.train.seed for r in p.runs] == [1, 2]
    assert not (tmp_path / "X").exists()  # prepared, nothing created
