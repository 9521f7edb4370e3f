"""The engine axis is open: a third engine (tests/engines/solo.py, registered in one line) is
validated with its own rules, planned with its own environment, refused where it lacks a
capability, and trains with the built-in trainer like the shipped engines."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpctrain.config import load_config
from hpctrain.engine import registry
from hpctrain.errors import ConfigError
from hpctrain.facts import HostFacts
from hpctrain.launch.local.plan import plan_local
from hpctrain.orchestrate.validate import validate
from hpctrain.parallel import derive, kind_of
from hpctrain.records import Layout


@pytest.fixture
def solo() -> Iterator[str]:
    before = dict(registry.ENGINES)
    registry.register_engine("solo", "tests.engines.solo:SoloEngine")  # the one registration line
    yield "solo"
    registry.ENGINES.clear()
    registry.ENGINES.update(before)


def _cfg(*overrides: str):
    return load_config(["parallelism.engine=solo", "cluster.ranks=1", "data=digits", *overrides])


def test_a_registered_engine_is_validated_and_planned_with_its_own_rules_and_environment(solo: str) -> None:
    cfg = _cfg()
    validate(cfg, HostFacts.example())
    plan = plan_local(cfg, HostFacts.example(), "/runs/r1", "/venv/bin/python")
    assert plan.env["HPCTRAIN_SOLO"] == "1" and "HOROVOD_CONTROLLER" not in plan.env
    with pytest.raises(ConfigError) as e:  # its own rule, and another engine's setting
        validate(_cfg("cluster.ranks=2", "parallelism.bucket_mb=4"))
    assert "cluster.ranks: the solo engine averages nothing" in str(e.value)
    assert "parallelism.bucket_mb: applies to engine=ddp only" in str(e.value)
    with pytest.raises(ConfigError, match="cannot average a pipeline stage over its replicas"):
        validate(_cfg("parallelism=hybrid", "parallelism.stages=2", "cluster.ranks=4", "model=mlp"))


def test_an_unknown_engine_names_the_registered_ones() -> None:
    with pytest.raises(
        ConfigError, match=r"(?s)parallelism.engine: no engine named 'nccl'.*use one of: horovod, ddp"
    ):
        validate(load_config(["parallelism.engine=nccl"]))


def test_the_built_in_trainer_trains_with_the_new_engine(solo: str, tmp_path: Path) -> None:
    from hpctrain.train.loop import train

    cfg = _cfg("train.steps=4", "train.warmup_steps=1", "train.batch_per_rank=16", "train.stall_timeout_s=0")
    engine = registry.engine_for(cfg)
    info = engine.init(Layout())
    stats = train(cfg, engine, info, derive(cfg), tmp_path, kind_of(cfg).build, emit=lambda line: None)
    assert stats is not None and stats.timed_steps == 3 and math.isfinite(stats.last_loss)
    assert (tmp_path / "model.pt").exists() and (tmp_path / "steps-rank0.jsonl").read_text().count("\n") == 4


def test_an_engine_is_built_with_its_own_settings_and_the_run_s_wiring_only() -> None:
    from hpctrain.config.schema import DdpSettings, HorovodSettings, ShardSettings
    from hpctrain.engine.base import EngineRun

    cfg = load_config(
        [
            "parallelism=fsdp",
            "parallelism.engine=ddp",
            "parallelism.bucket_mb=5",
            "parallelism.static_graph=true",
            "parallelism.shard.cpu_offload=true",
            "parallelism.compression=fp16",
            "precision=bf16",
            "train.device=cpu",
        ]
    )
    ddp = registry.engine_for(cfg)
    assert ddp.own == DdpSettings(bucket_mb=5.0, gradient_as_bucket_view=False, static_graph=True)
    assert ddp.run == EngineRun(
        device="cpu",
        backend="mpi",
        compression="fp16",
        precision="bf16",
        accumulate=1,
        microbatches=1,
        shard=ShardSettings(cpu_offload=True),
        rendezvous_s=300.0,  # train.stall_timeout_s: the ranks meet within it (engine/rendezvous.py)
    )
    hvd = registry.engine_for(load_config(["parallelism.fusion_threshold_mb=8", "parallelism.backend=gloo"]))
    assert hvd.own == HorovodSettings(fusion_threshold_mb=8.0, cycle_time_ms=None)
    assert hvd.run.backend == "gloo"


@pytest.mark.parametrize(
    ("layout", "started"),
    [
        (Layout(stages=2), "ddp"),  # a pure pipeline: nothing to average, Horovod's thread would spin
        (Layout(stages=2, replicate=2), "horovod"),  # hybrid: the replicas average through Horovod
        (Layout(replicate=2), "horovod"),
        (Layout(), "horovod"),  # one rank: the engine as configured
    ],
)
def test_the_ranks_start_the_configured_engine_only_where_it_has_something_to_average(
    layout: Layout, started: str
) -> None:
    cfg = load_config(["parallelism.engine=horovod"])
    assert registry.engine_on_ranks(cfg, layout).name == started  # built, not started: no init
    ddp = load_config(["parallelism.engine=ddp"])
    assert registry.engine_on_ranks(ddp, layout).name == "ddp"
