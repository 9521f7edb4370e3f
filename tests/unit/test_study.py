"""A study expanded into runs: strong keeps the global batch, weak the per-rank batch, both with
the study's learning-rate rule; every point's config is composed and derived as a run would be."""

from __future__ import annotations

from datetime import datetime

import pytest

from hpctrain.config import load_config
from hpctrain.errors import ConfigError
from hpctrain.orchestrate.study_run import create_study
from hpctrain.parallel import derive

COMMON = [
    "study.ranks=[1,2,4]",
    "study.repetitions=2",
    "study.global_batch=64",
    "study.batch_per_rank=24",
    "study.steps=10",
    "study.warmup_steps=2",
    "study.lr_scaling=linear",
    "optim.lr=0.1",
    "optim.reference_batch=32",
    "train.steps=999",  # the study's own steps win over the user's
]


@pytest.mark.parametrize(
    "kind,batches",
    [
        # world size: (per-rank batch, global batch)
        ("strong", {1: (64, 64), 2: (32, 64), 4: (16, 64)}),
        ("weak", {1: (24, 24), 2: (24, 48), 4: (24, 96)}),
    ],
)
def test_strong_keeps_the_global_batch_weak_the_per_rank_batch(kind: str, batches: dict) -> None:
    study_dir, manifest, _ = create_study(kind, COMMON, now=datetime(2026, 1, 2, 3, 4, 5))
    assert study_dir.name == f"03-04-05-train-{kind}"
    assert [(r.name, r.world_size, r.rep) for r in manifest.runs] == [
        (f"n{n}-r{k}", n, k) for n in (1, 2, 4) for k in (0, 1)
    ]
    for run in manifest.runs:
        cfg = load_config(run.overrides)
        d = derive(cfg)
        assert (d.world_size, (d.batch.per_rank, d.batch.global_)) == (
            run.world_size,
            batches[run.world_size],
        )
        # linear rule (Goyal et al. 2017): 0.1 x global / 32
        assert d.lr == pytest.approx(0.1 * batches[run.world_size][1] / 32)
        assert (cfg.train.steps, cfg.train.warmup_steps) == (10, 2)


def test_without_lr_scaling_every_point_keeps_the_configured_lr() -> None:
    _, manifest, _ = create_study("weak", [*COMMON, "study.lr_scaling=none"])
    assert {derive(load_config(r.overrides)).lr for r in manifest.runs} == {0.1}


def test_engines_are_compared_at_every_scale_interleaved() -> None:
    _, manifest, _ = create_study("strong", [*COMMON, "study.engines=[horovod,ddp]"])
    # engines innermost: each repetition of a scale runs both engines back to back
    assert [r.name for r in manifest.runs][:4] == ["horovod-n1-r0", "ddp-n1-r0", "horovod-n1-r1", "ddp-n1-r1"]
    assert len(manifest.runs) == 3 * 2 * 2
    for run in manifest.runs:
        cfg = load_config(run.overrides)
        assert str(cfg.parallelism.engine) == run.name.split("-")[0]
        assert derive(cfg).batch.global_ == 64  # same work for both engines


@pytest.mark.parametrize(
    "override,key,rule",
    [
        ("study.engines=[ddp,ddp]", "study.engines", "names an engine twice"),
        ("study.engines=[horovod,mxnet]", "study.engines[1]", "not one of horovod, ddp"),
    ],
)
def test_bad_engine_lists_are_refused(override: str, key: str, rule: str) -> None:
    with pytest.raises(ConfigError) as e:
        create_study("strong", [*COMMON, override])
    assert key in str(e.value) and rule in str(e.value)


def test_an_engine_comparison_checks_each_engines_rules_before_anything_runs() -> None:
    # bf16 gradient compression is a DDP hook only: the Horovod half of the study is refused
    with pytest.raises(ConfigError) as e:
        create_study("strong", [*COMMON, "study.engines=[horovod,ddp]", "parallelism.compression=bf16"])
    assert "parallelism.compression" in str(e.value) and "horovod-n1-r0" in str(e.value)
    assert "ddp-n1-r0" not in str(e.value)


def test_a_script_study_cannot_switch_engines(tmp_path) -> None:
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    with pytest.raises(ConfigError) as e:
        create_study(
            "strong", [*COMMON, "study.engines=[horovod,ddp]", f"script={script}", f"code.dir={tmp_path}"]
        )
    assert "a script chooses its own engine" in str(e.value)


def test_a_pipeline_study_grows_the_stages_with_the_ranks_and_compares_micro_batches() -> None:
    pipe = ["parallelism=pipeline", "model=mlp", "model.depth=4", "study.ranks=[2,4]", "study.repetitions=1"]
    _, manifest, _ = create_study("strong", [*pipe, "study.microbatches=[4,8]", "study.global_batch=64"])
    assert [r.name for r in manifest.runs] == ["m4-n2-r0", "m8-n2-r0", "m4-n4-r0", "m8-n4-r0"]
    for run in manifest.runs:
        par = load_config(run.overrides).parallelism
        assert (par.stages, par.microbatches) == (run.world_size, int(run.name[1]))
    with pytest.raises(ConfigError) as e:  # a 1-rank pipeline has no second stage
        create_study("strong", [*pipe, "study.ranks=[1,2]"])
    assert "parallelism.stages" in str(e.value) and "n1-r0" in str(e.value)


def test_micro_batches_are_refused_in_a_data_parallel_study() -> None:
    with pytest.raises(ConfigError) as e:
        create_study("strong", [*COMMON, "study.microbatches=[2,4]"])
    assert "study.microbatches" in str(e.value) and "pipeline setting" in str(e.value)
