"""hpctrain tune's search (analysis/tune.py) on hand-computed summaries, and its plan
(orchestrate/tune.py): which settings it searches, which values it refuses before anything runs."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from hpctrain import records
from hpctrain.analysis.roofline import MIB
from hpctrain.analysis.tune import (
    Effect,
    Knob,
    Search,
    Trial,
    candidate,
    candidates,
    exposed_share,
    next_knob,
    predict,
    verdict,
)
from hpctrain.bench.analyze import synthetic_summary
from hpctrain.config.override_file import overrides_file
from hpctrain.errors import ConfigError
from hpctrain.orchestrate.tune import plan_tune

BUCKETS = Knob("parallelism.bucket_mb", (1, 5, 25, 100), Effect.grouping)
WIRE = Knob("parallelism.compression", ("none", "fp16"), Effect.wire)
VIEW = Knob("parallelism.gradient_as_bucket_view", (False, True))
BASE = (("parallelism.bucket_mb", "25"), ("parallelism.compression", "none"), ("parallelism.gradient_as_bucket_view", "false"))  # fmt: skip


def _ddp(
    step_ms: float, comm_ms: float, compression: str = "none", bucket_mb: float = 25
) -> records.RunSummary:
    """Two DDP ranks, 4 Mi parameters in 8 tensors: 16 MiB of gradients (8 compressed); the run's
    probe: one value in 4 ms (the latency L of a collective), the gradients in 4 ms + 1 ms per MiB
    (beta at n=2)."""
    s = synthetic_summary(
        2, 64, step_ms / 1e3, (step_ms - comm_ms) / 1e3, comm_ms / 1e3, 0.0, 4 * 2**20, "ddp"
    )
    s = dataclasses.replace(s, compression=compression)
    return dataclasses.replace(
        s,
        grad_grouping="buckets",
        grad_bucket_bytes=int(bucket_mb * MIB),
        grad_tensors=8,
        probe_small_s=4e-3,
        probe_full_s=4e-3 + s.grad_bytes / MIB * 1e-3,
        imbalance_s=0.0,
    )


def test_a_value_predicted_clearly_slower_is_pruned_and_the_likeliest_gain_goes_first() -> None:
    # 25 MiB buckets: 1 MiB first + 1 more = 2 messages: expected 2 x 4 + 16 = 24 ms; 12 exposed: f = 0.5
    search = Search([BUCKETS, VIEW, WIRE], [Trial("trial-0", BASE, _ddp(100, 12))])
    assert exposed_share(search.trials) == pytest.approx(0.5)
    by_value = {c.value: c for c in candidates(search, BUCKETS)}
    assert set(by_value) == {"1", "5", "100"}  # the config's own 25 is trial-0
    # 1 MiB: 1 + 15 = 16 messages: 64 + 16 = 80 ms expected; 100 + 0.5 x (80 - 24) = 128 ms: 28% slower
    assert by_value["1"].predicted_s == pytest.approx(0.128)
    assert by_value["1"].pruned.startswith("predicted 128.00 ms, 28% slower than the best measured 100.00 ms")
    # 5 MiB: 1 + 3 = 4 messages: 32 ms expected: 104 ms, within 10%: tried
    assert by_value["5"].predicted_s == pytest.approx(0.104) and not by_value["5"].pruned
    assert by_value["100"].predicted_s == pytest.approx(0.100)
    # fp16 halves the 16 ms on the wire: 8 + 8 = 16 ms expected: 96 ms, the only predicted gain
    (fp16,) = candidates(search, WIRE)
    assert fp16.predicted_s == pytest.approx(0.096)
    assert fp16.settings == (*BASE[:1], ("parallelism.compression", "fp16"), BASE[2])
    assert next_knob(search) is WIRE
    search.done.append(WIRE.key)
    # no gain predicted from the buckets (100 MiB: the same 2 messages), but they are predicted
    assert next_knob(search) is BUCKETS
    search.done.append(BUCKETS.key)
    assert next_knob(search) is VIEW  # the model cannot see it: tried last
    assert math.isnan(candidates(search, VIEW)[0].predicted_s)


def test_every_trial_refits_the_exposed_share() -> None:
    fp16 = (BASE[0], ("parallelism.compression", "fp16"), BASE[2])
    trials = [Trial("trial-0", BASE, _ddp(100, 12)), Trial("trial-1", fp16, _ddp(92, 4, "fp16"))]
    # expected 24 and 16 ms, exposed 12 and 4: f = (24 x 12 + 16 x 4) / (24^2 + 16^2) = 352 / 832
    assert exposed_share(trials) == pytest.approx(352 / 832)
    # a trial predicts from the best one: 92 ms at fp16; 1 MiB buckets of its 8 MiB there: 8 x 4 +
    # 8 = 40 ms expected against 16: 92 + f x 24
    assert predict(trials[1], BUCKETS, "1", 352 / 832) == pytest.approx(0.092 + 352 / 832 * 0.024)


def test_what_the_model_missed_on_one_value_is_carried_to_the_knobs_others() -> None:
    wire = Knob("parallelism.compression", ("none", "fp16", "bf16"), Effect.wire)
    fp16 = (BASE[0], ("parallelism.compression", "fp16"), BASE[2])
    # fp16 was predicted at 96 ms (16 ms of halved bytes at f = 0.5) and took 141: its casts cost
    # compute the model does not charge
    tried = Trial("trial-1", fp16, _ddp(141, 4, "fp16"), predicted_s=0.096, knob=wire.key)
    search = Search([wire], [Trial("trial-0", BASE, _ddp(100, 12)), tried])
    c = candidate(search, wire, "bf16")
    f = exposed_share(search.trials)  # refitted with the fp16 trial: (24 x 12 + 16 x 4) / 832
    assert f == pytest.approx(352 / 832)
    # 100 + f x (16 - 24) ms, plus the 45 ms fp16 missed by
    assert c.predicted_s == pytest.approx(0.100 - f * 0.008 + 0.045)
    assert c.pruned.endswith("+45.00 ms: what 1 other value(s) of it missed by)"), c.pruned
    # had fp16 become the best, its step would hold its own miss: nothing more is added from it
    quick = Trial("trial-1", fp16, _ddp(80, 4, "fp16"), predicted_s=0.096, knob=wire.key)
    search = Search([wire], [Trial("trial-0", BASE, _ddp(100, 12)), quick])
    assert search.best is quick
    f = exposed_share(search.trials)
    assert candidate(search, wire, "bf16").predicted_s == pytest.approx(0.080)  # the same bytes as fp16
    assert candidate(search, wire, "none").predicted_s == pytest.approx(0.080 + f * 0.008)


def test_the_best_changes_only_beyond_the_noise_and_failures_are_named() -> None:
    first = Trial("trial-0", BASE, _ddp(100, 12))
    close = Trial("trial-1", BASE, _ddp(99, 11))  # 1% faster: within MIN_GAIN
    faster = Trial("trial-2", BASE, _ddp(90, 2))
    failed = Trial("trial-3", BASE, None, error="rank 1 failed")
    search = Search([BUCKETS], [first, close, failed])
    assert search.best is first
    assert verdict(search, close).startswith("within 2% of the best")
    assert verdict(search, failed) == "failed: rank 1 failed"
    search.trials.append(faster)
    assert search.best is faster and verdict(search, faster) == "best"
    assert verdict(search, first) == "11% slower"


def test_nothing_is_predicted_without_the_runs_own_probe() -> None:
    s = dataclasses.replace(_ddp(100, 12), probe_small_s=0.0, probe_full_s=0.0)
    assert math.isnan(predict(Trial("t", BASE, s), BUCKETS, "5", 0.5))


def test_the_plan_searches_the_engines_settings_and_refuses_bad_tunes_before_anything_runs() -> None:
    t = plan_tune(["parallelism.engine=ddp", "cluster.ranks=2"], None)
    assert [k.key for k in t.knobs] == [
        "parallelism.bucket_mb", "parallelism.compression", "parallelism.gradient_as_bucket_view",
    ]  # fmt: skip
    assert dict(t.base)["parallelism.bucket_mb"] == "25"
    hvd = plan_tune(["cluster.ranks=2", "tune.keys=[parallelism.fusion_threshold_mb]"], None)
    assert [(k.key, k.values) for k in hvd.knobs] == [
        ("parallelism.fusion_threshold_mb", (0, 4, 16, 64, 128))
    ]
    for overrides, key in (
        (["cluster.ranks=1"], "cluster"),
        (["tune.keys=[parallelism.bucket_mb]"], "tune.keys"),  # horovod's knobs are not ddp's
        (["tune.budget_min=0"], "tune.budget_min"),
        (
            ["cluster=slurm", "cluster.nodes=2", "cluster.ranks_per_node=2", "tune.target_ranks=5"],
            "tune.target_ranks",
        ),
    ):
        with pytest.raises(ConfigError) as e:
            plan_tune(overrides, None)
        assert e.value.problems[0].key == key, (overrides, e.value.problems)


def test_micro_batch_counts_that_do_not_divide_the_batch_are_left_out_with_the_rule() -> None:
    t = plan_tune(
        ["parallelism=pipeline", "cluster.ranks=2", "parallelism.stages=2", "train.batch_per_rank=12"], None
    )
    knobs = {k.key: k.values for k in t.knobs}
    assert knobs["parallelism.microbatches"] == (1, 2, 4)
    assert any(
        w.startswith("parallelism.microbatches=8: 8 micro-batches do not divide") for w in t.invalid
    ), t.invalid


def test_an_override_file_is_read_back_and_a_bad_one_named(tmp_path: Path) -> None:
    good = tmp_path / "best.yaml"
    good.write_text("# a comment\n- parallelism.engine=ddp\n- parallelism.bucket_mb=5\n")
    assert overrides_file(good) == ["parallelism.engine=ddp", "parallelism.bucket_mb=5"]
    for text, why in (("{a: 1}", "is not a list"), ("- [", "is not YAML"), ("- novalue", "is not a list")):
        good.write_text(text)
        with pytest.raises(ConfigError) as e:
            overrides_file(good)
        assert e.value.problems[0].key == "--overrides-file" and why in e.value.problems[0].rule
    with pytest.raises(ConfigError, match="cannot be read"):
        overrides_file(tmp_path / "missing.yaml")


def test_sharding_searches_resharding_tensor_parallel_degrees_and_shard_groups_its_model_allows() -> None:
    fsdp = plan_tune(["parallelism=fsdp", "cluster.ranks=4", "model=transformer", "data=tokens"], None)
    knobs = {k.key: k.values for k in fsdp.knobs}
    assert knobs == {
        "parallelism.shard.reshard_after_forward": (True, False),
        "parallelism.tp.degree": (1, 2, 4),
    }
    # hsdp: one group of all 4 ranks is no replication, refused as hsdp's rules say; tensor
    # parallelism of 2 over groups of 2 leaves one group too
    hsdp = ["parallelism=hsdp", "cluster.ranks=4", "parallelism.shard.degree=2"]
    t = plan_tune(hsdp, None)
    knobs = {k.key: k.values for k in t.knobs}
    assert knobs["parallelism.shard.degree"] == (1, 2) and "parallelism.tp.degree" not in knobs
    assert any(w.startswith("parallelism.shard.degree=4: hsdp replicates") for w in t.invalid), t.invalid
    assert any(w.startswith("parallelism.tp.degree=2: ") for w in t.invalid), t.invalid


def test_a_pipeline_searches_its_schedules_and_leaves_out_those_its_stages_refuse(tmp_path: Path) -> None:
    from hpctrain.orchestrate.tune import Tuner

    t = plan_tune(["parallelism=pipeline", "cluster.ranks=2", "parallelism.stages=2", "model=mlp"], None)
    schedules = dict((k.key, k.values) for k in t.knobs)["parallelism.schedule"]
    assert "gpipe" in schedules and "1f1b" in schedules, (schedules, t.invalid)
    # values valid alone may be refused together: such a candidate is left out with the rule
    tuner = Tuner(t, tmp_path, lambda _: None, 60)
    one_1f1b = (("parallelism.microbatches", "1"), ("parallelism.schedule", "1f1b"))
    assert tuner.refused(one_1f1b).startswith(
        "parallelism.microbatches: 1F1B keeps one micro-batch in flight"
    )
    assert tuner.refused((("parallelism.microbatches", "2"), ("parallelism.schedule", "1f1b"))) == ""
    assert tuner.refused(t.base) == ""


def test_a_tunes_trials_are_tracked_as_a_sweeps_points(tmp_path: Path) -> None:
    from hpctrain.tracking.groups import members

    trials = [
        records.TuneTrial("trial-0", []),
        records.TuneTrial("trial-1", ["parallelism.compression=fp16"]),
    ]
    m = records.new(
        records.TuneManifest, launcher="local", overrides=["model=mlp"], config_dir=None, trials=trials
    )
    records.write(tmp_path / records.TUNE, m)
    assert members(tmp_path) == (
        "sweep",
        [
            (tmp_path / "trial-0", ["model=mlp"]),
            (tmp_path / "trial-1", ["model=mlp", "parallelism.compression=fp16"]),
        ],
    )


def test_a_dry_run_lists_each_setting_with_its_values_and_starts_nothing(tmp_path: Path) -> None:
    from tests.conftest import hpctrain_here

    r = hpctrain_here("tune", "--dry-run", "parallelism.engine=ddp", f"run.output_root={tmp_path}")
    assert r.returncode == 0, r.stderr
    assert "parallelism.bucket_mb: 1, 5, 25, 100 (now 25; grouping)" in r.stdout, r.stdout
    assert "parallelism.gradient_as_bucket_view: false, true (now false; unmodelled)" in r.stdout
    assert "nothing was started" in r.stdout and not any(tmp_path.iterdir())


def test_the_values_tried_are_refused_each_with_its_own_error_whether_or_not_all_compose() -> None:
    """A tune's values are composed together (refusals: one compose); one that does not compose
    sends each to its own, and every error stays its point's."""
    from hpctrain.orchestrate.runs import refusals

    def said(points: list[list[str]]) -> list[object]:
        return [None if e is None else (e.keys, e.problems[0].rule) for e in refusals(points)]

    fine, bad = ["train.steps=9"], ["train.steps=9", "cluster.ranks=0"]
    ranks = (["cluster.ranks"], "must be >= 1 (got 0)")
    assert said([fine, bad]) == [None, ranks]
    assert said([fine, ["train.steps=9", "model.widht=3"], bad]) == [
        None, (["model.widht"], "unknown key (Key 'widht' not in 'ModelConf')"), ranks,
    ]  # fmt: skip


def test_the_budget_counts_a_resumed_tunes_earlier_invocations(tmp_path: Path) -> None:
    from hpctrain.orchestrate.tune import Tuner

    t = plan_tune(["parallelism.engine=ddp", "cluster.ranks=2", "tune.budget_min=10"], None)
    fresh = Tuner(t, tmp_path, lambda _: None, 60)
    assert not fresh.over_budget and fresh.manifest().spent_s < 5
    before = dataclasses.replace(fresh.manifest(), spent_s=599.0)
    assert not Tuner(t, tmp_path, lambda _: None, 60, before).over_budget  # 1 s of the 10 min left
    spent = Tuner(t, tmp_path, lambda _: None, 60, dataclasses.replace(before, spent_s=600.0))
    assert spent.over_budget and spent.manifest().spent_s >= 600.0


def test_a_slurm_dry_run_shows_the_allocation_and_how_a_trial_starts_in_it(tmp_path: Path) -> None:
    from tests.conftest import hpctrain_here

    home = tmp_path / "t"
    r = hpctrain_here(
        "tune", "--dry-run", "cluster=slurm", "cluster.nodes=2", "cluster.ranks_per_node=2",
        "cluster.time_min=30", "tune.budget_min=4.5", "parallelism.engine=ddp", f"run.dir={home}",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    for want in (
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=2",
        "#SBATCH --time=35",
        "#SBATCH --job-name=train-alloc",
    ):
        assert want in lines, r.stdout  # the budget rounded up, plus one trial's cluster.time_min
    beat = f"$(stat -c %Y {home}/allocation/heartbeat 2>/dev/null || echo 0)"
    hold = f"while [ ! -e {home}/allocation/release ]; do [ $(( $(date +%s) - {beat} )) -lt 180 ] || exit 0; sleep 1; done"
    assert hold in lines, r.stdout  # released by the file, or ended once the command's heartbeat is stale
    [srun] = [line for line in lines if line.startswith("exec srun --jobid=ALLOC ")]
    assert f"--output {home}/trial-0/submitit/%j.%s_%t_log.out" in srun and "--ntasks-per-node=2" in srun
    assert lines[-1] == "budget: 4.5 min; nothing was started" and not home.exists()
