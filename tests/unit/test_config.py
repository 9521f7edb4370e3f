"""Config composition, unknown keys, and the table of invalid configs (no process started)."""

from __future__ import annotations

import os

import pytest

from hpctrain.config import load_config
from hpctrain.config.load import config_from_yaml
from hpctrain.config.plain_yaml import to_yaml
from hpctrain.config.schema import LocalClusterConf
from hpctrain.errors import ConfigError
from hpctrain.facts import HostFacts
from hpctrain.orchestrate.validate import validate
from hpctrain.parallel import resolve_batch


def test_defaults_compose_to_typed_config() -> None:
    cfg = load_config([])
    assert cfg.model.name == "cnn"
    assert cfg.data.name == "synthetic"
    assert isinstance(cfg.cluster, LocalClusterConf)
    assert cfg.cluster.ranks == 2
    validate(cfg, HostFacts.example())


def test_group_options_and_overrides_apply() -> None:
    cfg = load_config(
        [
            "model=transformer",
            "data=tokens",
            "precision=bf16",
            "cluster.ranks=4",
            "optim=adamw",
            "train.steps=7",
        ]
    )
    assert (cfg.model.name, cfg.model.width, cfg.data.name) == ("transformer", 128, "tokens")
    assert (cfg.precision.name, cfg.cluster.ranks, cfg.optim.name, cfg.train.steps) == ("bf16", 4, "adamw", 7)


def test_a_compose_neither_copies_hydras_store_nor_converts_the_schema_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What made a compose cost twice its CPU (0.34 -> 0.16 CPU-s here): Hydra deep-copied the
    ConfigStore, every structured config in it, with its config repository at each compose, and
    hpctrain stored its schema again at each. Within a compose the store stays shared and its
    entries are stored once; outside one, a copy of the store is a copy (Hydra's own state
    snapshots, Singleton.get_state, depend on it); composing still works."""
    import copy

    from hydra._internal.config_repository import ConfigRepository
    from hydra.core.config_store import ConfigStore

    load_config([])
    store = ConfigStore.instance()
    stored = store.repo["hpctrain_schema.yaml"]
    deepcopy, shared = copy.deepcopy, []

    def spy(x: object, memo: dict[int, object] | None = None) -> object:
        out = deepcopy(x, memo)
        if isinstance(x, ConfigRepository):
            shared.append(out.get_schema_source().store is store)
        return out

    monkeypatch.setattr(copy, "deepcopy", spy)
    cfg = load_config(["train.steps=3"])
    monkeypatch.undo()
    assert shared == [True]  # Hydra's one copy of its repository, holding the same store
    assert store.repo["hpctrain_schema.yaml"] is stored and cfg.train.steps == 3
    assert load_config([]).train.steps != 3  # nothing an earlier compose set leaks into the next
    assert copy.deepcopy(store) is not store


def test_yaml_round_trip_keeps_every_value() -> None:
    cfg = load_config(
        ["model=resnet18", "+cluster.env.FOO=bar", "train.global_batch=64", "train.batch_per_rank=null"]
    )
    again = config_from_yaml(to_yaml(cfg))
    assert again == cfg


def test_reads_of_config_yaml_share_one_schema_and_leave_it_as_it_was() -> None:
    """Each read merges onto the schema made once a process (schema_node): one read's values
    never reach the next, nor another cluster's section."""
    from hpctrain.config.load import schema_node

    slurm = config_from_yaml(to_yaml(load_config(["cluster=slurm", "cluster.nodes=3", "train.steps=9"])))
    local = config_from_yaml(to_yaml(load_config([])))
    assert (slurm.cluster.nodes, slurm.train.steps) == (3, 9)
    assert isinstance(local.cluster, LocalClusterConf) and local.train.steps != 9
    assert schema_node("slurm") is schema_node("slurm") and schema_node("slurm").cluster.nodes != 3


@pytest.mark.parametrize("text", ["cluster: 5\n", "cluster: {name: cloud}\n", "train: {}\n"])
def test_a_config_yaml_without_a_known_cluster_names_the_key(text: str) -> None:
    with pytest.raises(ConfigError, match="cluster.name"):
        config_from_yaml(text)


def test_unknown_key_names_it_and_lists_valid_keys() -> None:
    with pytest.raises(ConfigError) as e:
        load_config(["model.widht=3"])
    assert e.value.keys == ["model.widht"]
    assert "width (default: 16)" in str(e.value)


def test_unknown_top_level_key() -> None:
    with pytest.raises(ConfigError) as e:
        load_config(["foo=1"])
    assert "foo" in e.value.keys[0]
    assert "valid keys are" in str(e.value) and "model" in str(e.value)


@pytest.mark.parametrize(
    ("override", "said"),
    [
        ("engine=ddp", "did you mean parallelism.engine=...?"),
        (
            "degree=2",
            "did you mean parallelism.shard.degree=... or parallelism.tp.degree=... or parallelism.cp.degree=...?",
        ),
        ("partition=gpu", "did you mean cluster.partition=...?"),  # a cluster schema's key
        ("+ranks=4", "cluster.ranks=..."),  # forced in with +: the same hint
        ("model.steps=3", "did you mean train.steps=... or study.steps=... or profile.steps=...?"),
    ],
)
def test_a_key_given_without_its_section_is_pointed_to_it(override: str, said: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_config([override])
    assert said in str(e.value), str(e.value)


@pytest.mark.parametrize("override", ["model=cnn,mlp", "train.steps=1,2", "train.steps=range(1,3)"])
def test_a_sweep_without_multirun_says_to_add_m(override: str) -> None:
    """Hydra said 'Ambiguous value' for a key and showed its ChoiceSweep object for a group."""
    with pytest.raises(ConfigError) as e:
        load_config([override])
    text = str(e.value)
    assert f"{override} gives several values, and only a multirun sweeps them" in text, text
    assert f"sweep them with -m ({override})" in text and "Sweep(" not in text, text


def test_appended_unknown_key_is_rejected_not_dropped() -> None:
    with pytest.raises(ConfigError) as e:
        load_config(["+model.x=1"])
    assert e.value.keys == ["model.x"]
    assert "width" in str(e.value)


def test_new_env_key_without_plus_gets_hydra_hint() -> None:
    with pytest.raises(ConfigError) as e:
        load_config(["cluster.env.FOO=bar"])
    assert e.value.keys == ["cluster.env.FOO"]
    assert "+cluster.env.FOO=bar" in str(e.value)


def test_bad_override_syntax_is_a_config_error() -> None:
    with pytest.raises(ConfigError) as e:
        load_config(["train.steps"])
    assert e.value.keys == ["train.steps"]
    assert "key=value" in str(e.value)


def test_unknown_key_in_cluster_lists_local_keys() -> None:
    with pytest.raises(ConfigError) as e:
        load_config(["cluster.rank=3"])
    assert e.value.keys == ["cluster.rank"]
    assert "ranks (default: 2)" in str(e.value)


def test_wrong_type_names_key() -> None:
    with pytest.raises(ConfigError) as e:
        load_config(["train.steps=many"])
    assert e.value.keys == ["train.steps"]
    assert "wrong type" in str(e.value)


def test_unknown_group_option_lists_available() -> None:
    with pytest.raises(ConfigError) as e:
        load_config(["model=vgg"])
    assert e.value.keys == ["model"]
    assert "cnn" in str(e.value) and "resnet50" in str(e.value)


def test_missing_mandatory_value_names_key() -> None:
    with pytest.raises(ConfigError) as e:
        validate(load_config(["data=folder"]))
    assert e.value.keys == ["data.path"]


# (overrides, the key the error must name). Every row is a rule that must hold before launch.
INVALID = [
    (["cluster.ranks=0"], "cluster.ranks"),
    (["optim.lr=inf"], "optim.lr"),  # every float must be finite, whatever its key
    (["cluster.ranks=17", "data.num_samples=100000"], "cluster.ranks"),  # > 8 per core on 2 cores
    (["optim.lr=nan"], "optim.lr"),
    (["optim.momentum=nan"], "optim.momentum"),
    (["precision.init_scale=-inf"], "precision.init_scale"),
    (["data=folder", "data.path='/data/a\tb'"], "data.path"),  # no control character in any string
    (["+cluster.env.X='a\nb'"], "cluster.env.X"),
    (["cluster.extra_args=['--x\n']"], "cluster.extra_args[0]"),
    (["run.dir='~no-such-user-hpctrain/x'"], "run.dir"),
    (["train.steps=0"], "train.steps"),
    (["train.warmup_steps=50", "train.steps=50"], "train.warmup_steps"),
    (["train.global_batch=64"], "train.batch_per_rank"),  # both batch kinds set
    (["train.batch_per_rank=null"], "train.batch_per_rank"),  # neither set
    (["train.batch_per_rank=null", "train.global_batch=33", "cluster.ranks=2"], "train.global_batch"),
    (["train.batch_per_rank=0"], "train.batch_per_rank"),
    (
        ["train.batch_per_rank=10", "parallelism.backward_passes_per_step=3"],
        "parallelism.backward_passes_per_step",
    ),
    (["parallelism.backward_passes_per_step=0"], "parallelism.backward_passes_per_step"),
    (["precision.name=fp8"], "precision.name"),
    (["parallelism.backend=nccl2"], "parallelism.backend"),
    (["parallelism.compression=int8"], "parallelism.compression"),
    (["parallelism.fusion_threshold_mb=-1"], "parallelism.fusion_threshold_mb"),
    (["parallelism.cycle_time_ms=0"], "parallelism.cycle_time_ms"),
    (["optim.lr=0"], "optim.lr"),
    (["optim.momentum=1.5"], "optim.momentum"),
    (["optim.lr_scaling=sqrt"], "optim.lr_scaling"),
    (["model=transformer"], "data.name"),  # transformer on images
    (["data=tokens"], "model.name"),  # cnn on tokens
    (["model=transformer", "data=tokens", "model.heads=3"], "model.heads"),
    (["data.image_size=2"], "data.image_size"),
    (["data=digits", "data.image_size=16"], "data.channels"),
    (["data.num_samples=10"], "data.num_samples"),
    (["data=folder", "data.path=/nonexistent/images"], "data.path"),
    (["data.num_workers=-1"], "data.num_workers"),
    (["data.prefetch_factor=4"], "data.prefetch_factor"),  # without workers
    (["debug.fail_rank=5"], "debug.fail_rank"),
    (["debug.fail_rank=1", "debug.fail_step=99"], "debug.fail_step"),
    (["run.name='a;rm -rf ~'"], "run.name"),
    (["run.name=a;rm -rf ~"], "run.name"),  # rejected by Hydra's override parser already
    (["run.name=../../etc"], "run.name"),
    (["+cluster.env.BAD-NAME=1"], "cluster.env.BAD-NAME"),
    (["train.device=tpu"], "train.device"),
    (["debug.slow_rank=2", "cluster.ranks=2"], "debug.slow_rank"),
    (["debug.slow_s=-1"], "debug.slow_s"),
    (["debug.hold_step=0"], "debug.hold_step"),
    (["debug.hold_step=100", "train.steps=100"], "debug.hold_step"),
    (["train.compile_mode=fastest"], "train.compile_mode"),
    (
        ["train.compile=true", "parallelism=pipeline", "parallelism.stages=2", "cluster.ranks=2"],
        "train.compile",
    ),
    (["train.compile=true", "script.path=train.py"], "train.compile"),
]


@pytest.mark.parametrize("overrides,key", INVALID, ids=[" ".join(o) for o, _ in INVALID])
def test_invalid_config_is_rejected_naming_the_key(overrides: list[str], key: str) -> None:
    with pytest.raises(ConfigError) as e:
        validate(load_config(overrides), HostFacts.example())
    assert key in e.value.keys, str(e.value)
    problem = next(p for p in e.value.problems if p.key == key)
    assert problem.rule and problem.fix  # every problem says what is wrong and how to fix it


def test_host_rules_use_the_facts_given() -> None:
    cfg = load_config(["train.device=cuda"])
    with pytest.raises(ConfigError) as e:
        validate(cfg, HostFacts.example(cuda_available=False))
    assert e.value.keys == ["train.device"]
    validate(cfg, HostFacts.example(cuda_available=True, cuda_bf16=True))
    fp16 = load_config(["precision=fp16"])
    with pytest.raises(ConfigError) as e:
        validate(fp16, HostFacts.example(cpu_fp16_autocast=False))
    assert e.value.keys == ["precision.name"]
    bf16_gpu = load_config(["precision=bf16"])
    with pytest.raises(ConfigError):
        validate(bf16_gpu, HostFacts.example(cuda_available=True, cuda_bf16=False))


def test_all_problems_are_reported_at_once() -> None:
    # (an invalid option such as precision.name=fp8 is an enum value, rejected when loading)
    with pytest.raises(ConfigError) as e:
        validate(load_config(["cluster.ranks=0", "optim.lr=-1", "precision.init_scale=0"]))
    assert {"cluster.ranks", "optim.lr", "precision.init_scale"} <= set(e.value.keys)


def test_an_option_outside_its_set_lists_the_valid_ones() -> None:
    with pytest.raises(ConfigError) as e:
        load_config(["precision.name=fp8"])
    assert e.value.keys == ["precision.name"]
    assert "'fp8' is not one of fp32, fp16, bf16" in str(e.value) and "precision.name=fp32" in str(e.value)


@pytest.mark.parametrize(
    "overrides,per_rank,global_,micro",
    [
        (["train.batch_per_rank=32", "cluster.ranks=4"], 32, 128, 32),
        (["train.batch_per_rank=null", "train.global_batch=96", "cluster.ranks=3"], 32, 96, 32),
        (["train.batch_per_rank=32", "parallelism.backward_passes_per_step=4"], 32, 64, 8),
    ],
)
def test_batch_resolution(overrides: list[str], per_rank: int, global_: int, micro: int) -> None:
    b = resolve_batch(load_config(overrides))
    assert (b.per_rank, b.global_, b.micro) == (per_rank, global_, micro)


SWEEP_POINTS = [
    ["cluster=slurm", "cluster.nodes=2", "precision=bf16"],
    ["cluster=slurm", "cluster.nodes=4", "precision=bf16", "train.seed=3"],
    ["model=transformer", "data=tokens", "model.width=64", "+cluster.env.A=b"],
    ["train.global_batch=64", "train.batch_per_rank=null", "optim=adamw", "optim.betas=[0.8,0.9]"],
    ["cluster=local", "cluster.ranks=3", "run.name=x"],
]


def test_load_configs_equals_load_config_point_by_point() -> None:
    from hpctrain.config.points import load_configs

    assert load_configs(SWEEP_POINTS) == [load_config(p) for p in SWEEP_POINTS]


@pytest.mark.parametrize(
    "bad,key",
    [
        (["cluster=slurm", "cluster.nodez=2"], "cluster.nodez"),
        (["train.steps=x"], "train.steps"),
        (["model=vgg"], "model"),
    ],
)
def test_load_configs_reports_the_same_errors(bad: list[str], key: str) -> None:
    from hpctrain.config.points import load_configs

    with pytest.raises(ConfigError) as e:
        load_configs([["train.seed=1"], bad])
    assert e.value.keys == [key]


def test_a_leading_tilde_in_a_path_option_is_the_home_directory() -> None:
    cfg = load_config(["run.dir='~/runs/a'", "run.output_root='~'"])
    assert cfg.run.dir == os.path.expanduser("~") + "/runs/a"
    assert cfg.run.output_root == os.path.expanduser("~")


def test_one_problem_per_non_finite_value() -> None:
    with pytest.raises(ConfigError) as e:
        validate(load_config(["optim.lr=nan"]), HostFacts.example())
    assert [str(p) for p in e.value.problems] == [
        "optim.lr: must be a finite number (got nan)\n    fix: set optim.lr to a finite value"
    ]


def test_many_ranks_per_core_need_an_explicit_oversubscribe() -> None:
    at_limit = ["cluster.ranks=16", "data.num_samples=100000"]
    validate(load_config(at_limit), HostFacts.example())  # 8 per core: allowed
    validate(
        load_config(["cluster.ranks=40", "cluster.oversubscribe=true", "data.num_samples=100000"]),
        HostFacts.example(),
    )


@pytest.mark.parametrize("override", ["study.ranks=[1,2]", "study.engines=[horovod,ddp]"])
def test_a_study_key_outside_a_study_names_the_key_and_the_command(override: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_config([override])
    [problem] = e.value.problems
    assert problem.key == override.split("=")[0]
    assert "study is not selected" in problem.rule and "hpctrain study strong|weak" in problem.fix


# a sweep whose points differ in plain leaves only: the fast path (one typed base, leaves set)
LEAF_POINTS = [
    ["data=digits", "precision=bf16", f"train.seed={i}", f"run.dir='~/r{i}'", f"optim.betas=[0.{i},0.9]"]
    + ([f"script.path=s{i}.py"] if i % 2 else ["parallelism.backend=gloo"])
    for i in range(1, 5)
]


def test_a_sweep_of_leaves_is_one_typed_config_per_point_and_equals_load_config(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from hpctrain.config import points

    built = []
    real = points._to_config
    monkeypatch.setattr(points, "_to_config", lambda cfg: built.append(1) or real(cfg))
    got = points.load_configs(LEAF_POINTS)
    assert len(built) == 1  # the shared base only: every point set its leaves on a copy
    assert got == [load_config(p) for p in LEAF_POINTS]
    assert got[0].run.dir == os.path.expanduser("~/r1") and got[0].script.path == os.path.abspath("s1.py")
    assert got[1].parallelism.backend == "gloo" and got[0].optim.betas == [0.1, 0.9]
    # a key set twice (shared and per point) or under another key takes Hydra's path, in order
    twice = [["train.seed=1", "train.seed=2"], ["train.seed=1", "train.seed=3"]]
    assert points.load_configs(twice) == [load_config(p) for p in twice]


@pytest.mark.parametrize(
    "text",
    ["train.seed=5", "train.seed=-12", "train.seed=0", "run.name=abc_1", "model=mlp", "a.b_c.d=X9"]
    + ["train.seed=007", "run.name=true", "optim.lr=1e-3", "run.name=inf", "x=NaN", "run.name='a b'"],
)
def test_the_quick_override_reader_gives_what_hydras_grammar_gives(text: str) -> None:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from hpctrain.config.points import _parse_one

    want = OverridesParser.create().parse_override(text)
    got = _parse_one(text)
    assert (got.type, got.key_or_group, got.value_type, repr(got.value()), got.package, got.input_line) == (
        want.type,
        want.key_or_group,
        want.value_type,
        repr(want.value()),  # nan == nan is false; their reprs agree
        want.package,
        want.input_line,
    )
    assert type(got.value()) is type(want.value())
