"""A study expanded into runs: strong keeps the global batch, weak the per-rank batch, both with
the study's learning-rate rule; every point's config is composed and derived as a run would be."""

from __future__ import annotations

from datetime import datetime

import pytest

from hpctrain.config import load_config
from hpctrain.derived import derive
from hpctrain.study_run import create_study

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
