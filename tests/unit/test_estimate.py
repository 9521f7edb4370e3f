"""Estimates before submitting (analysis/estimate.py): figures against hand-computed values, the
time-limit warning and its fixes, and the refusals (evidence that cannot speak for a point)."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import pytest

from hpctrain.analysis.estimate import (
    MIN_BAND,
    Band,
    Evidence,
    Measured,
    NoEstimate,
    Target,
    estimate_point,
    total,
)
from hpctrain.analysis.model import CommModel
from hpctrain.analysis.stepmodel import Scale, StepModel
from tests.conftest import hpctrain_here

# 2 ranks on one node: 10 ms steps (p95 2% above p50), 50 ms warm-up steps, 3 s from the launch to
# the first step, 0.5 s after the last
TWO = Measured(2, 1, 16, 1, 0.010, 0.02, 0.050, 3.0, 0.5)


BASE = Target("p", n=2, nodes=1, batch_per_rank=16, threads=1, steps=100, warmup_steps=5, cores=2)


def target(**kw: Any) -> Target:
    return dataclasses.replace(BASE, **kw)


def test_a_measured_scale_is_its_own_step_plus_setup_warm_up_and_the_rest() -> None:
    e = estimate_point(Evidence("probe", (TWO,), None), target())
    # wall = setup + fixed + 5 warm-up steps + 95 steps = 3 + 0.5 + 0.25 + 0.95
    assert e.wall_s.value == pytest.approx(4.7)
    assert e.step_s.value == 0.010 and e.step_s.band == MIN_BAND  # a 2% spread is held to 5%
    assert e.throughput.value == pytest.approx(32 / 0.010)
    # the steps (1.2 s of the 4.7) carry the step's band, the 3 s setup 20% (one run to tell)
    assert e.wall_s.hi == pytest.approx(4.7 + 0.05 * 1.2 + 0.2 * 3.0)
    assert e.node_hours.value == pytest.approx(4.7 / 3600)
    assert e.core_hours.value == pytest.approx(2 * 4.7 / 3600)
    assert e.how == "measured at N=2" and e.over_limit == ""


def test_a_run_past_its_time_limit_is_flagged_with_the_settings_that_fit() -> None:
    e = estimate_point(Evidence("probe", (TWO,), None), target(steps=10000, time_limit_s=60.0))
    # upper end: 3.5 s + 20% of the 3 s setup + (0.25 + 9995 x 0.01) x 1.05 = 109.31 s
    assert e.wall_s.hi == pytest.approx(109.31)
    assert e.over_limit == (
        "will exceed its time limit of 1 min (up to 1.8 min): cluster.time_min=3, "
        "train.steps=5488 (what fits), or checkpoint and requeue: cluster.checkpoint_interval=N "
        "cluster.max_requeues=K"
    )
    requeued = estimate_point(
        Evidence("probe", (TWO,), None), target(steps=10000, time_limit_s=60.0, requeues=True)
    )
    assert "requeue" not in requeued.over_limit and "cluster.time_min=3" in requeued.over_limit
    # 5600 steps: 59.75 s expected, but up to 63.1 s
    close = estimate_point(Evidence("probe", (TWO,), None), target(steps=5600, time_limit_s=60.0))
    assert close.wall_s.value < 60 < close.wall_s.hi and close.over_limit.startswith("may exceed")


def _model() -> StepModel:
    # the ring's latency 1 ms per collective, 1 ns per byte, 1 MB of gradients in one message, all
    # of it exposed; measured at N=2: 6 ms compute, 2 ms communication, 1 ms data
    scale = Scale(2, 16, 1, 0.006, 0.002, 0.001, 0.0, 0.009)
    return StepModel(CommModel(0.0, 1e-9, 1e-3), 1e6, 1, 1.0, math.nan, 1.0, (scale,))


def test_another_scale_comes_from_the_step_model_with_its_extrapolated_share_as_the_band() -> None:
    e = estimate_point(Evidence("run", (TWO,), _model()), target(n=4, nodes=2, cores=4))
    # N=4: compute 6 ms + data 1 ms + allreduce (1 ms + 2*3/4 * 1e6 B * 1 ns) = 9.5 ms
    assert e.step_s.value == pytest.approx(0.0095)
    # no leave-one-out to test the model: the spread (held to 5%) + the communication's share
    assert e.step_s.band == pytest.approx(MIN_BAND + 0.0025 / 0.0095)
    assert e.how == "step model from N=2 (one scale: communication known to 2x)"
    # warm-up steps in proportion to the step: 5 x 50 ms x 9.5 / 10
    assert e.wall_s.value == pytest.approx(3.5 + 5 * 0.05 * 0.95 + 95 * 0.0095)
    assert e.node_hours.value == pytest.approx(2 * e.wall_s.value / 3600)
    studied = estimate_point(Evidence("study", (TWO,), _model(), loo_band=0.12), target(n=4))
    assert studied.step_s.band == 0.12 and "leave-one-out" in studied.how
    # never surer than the scale it starts from: a spread of 30% there
    noisy = dataclasses.replace(TWO, spread=0.3)
    assert (
        estimate_point(Evidence("study", (noisy,), _model(), loo_band=0.12), target(n=4)).step_s.band == 0.3
    )


def test_evidence_that_cannot_speak_for_a_point_says_why() -> None:
    with pytest.raises(NoEstimate, match=r"measured N=2 and cannot extrapolate to N=8"):
        estimate_point(Evidence("a run", (TWO,), None), target(n=8))
    bad = StepModel(CommModel(0.0, 1e-9, 1e-3), 1e6, 1, 1.0, math.nan, 3.0, (), ("a share above 1",))
    with pytest.raises(NoEstimate, match="does not describe a run: a share above 1"):
        estimate_point(Evidence("a run", (TWO,), bad), target(n=8))


def test_the_total_adds_values_and_upper_ends() -> None:
    ev = Evidence("probe", (TWO,), None)
    a, b = estimate_point(ev, target()), estimate_point(ev, target(steps=200))
    wall, nodes, cores = total([a, b])
    assert wall.value == pytest.approx(a.wall_s.value + b.wall_s.value)
    assert wall.hi == pytest.approx(a.wall_s.hi + b.wall_s.hi)
    assert nodes.value == pytest.approx((a.wall_s.value + b.wall_s.value) / 3600)
    assert cores.hi == pytest.approx(a.core_hours.hi + b.core_hours.hi)
    assert Band(2.0, 0.5).text(".2f") == "2.00 (1.33–3.00)" and Band(math.nan, 0.1).text("g") == "-"


def test_estimate_refusals_name_the_fix_before_anything_starts(tmp_path: Path) -> None:
    r = hpctrain_here("run", "--from", str(tmp_path))
    assert r.returncode == 2 and "--from" in r.stderr and "add --estimate" in r.stderr, r.stderr
    r = hpctrain_here("run", "--estimate", "cluster=slurm", "cluster.nodes=2")
    assert r.returncode != 0 and "--from DIR" in r.stderr and "probing would submit one" in r.stderr, r.stderr
    r = hpctrain_here("run", "--estimate", "--from", str(tmp_path))
    assert r.returncode != 0 and "neither a finished run" in r.stderr, r.stderr
    r = hpctrain_here("study", "weak", "study.ranks=[1,2]", "--estimate", "--from", str(tmp_path / "nope"))
    assert r.returncode != 0 and "neither a finished run" in r.stderr, r.stderr
    assert not list(tmp_path.iterdir())


def test_repetitions_of_a_scale_merge_into_means_and_their_setups_range() -> None:
    from hpctrain.analysis.evidence import merged

    a = dataclasses.replace(TWO, step_s=0.010, setup_s=2.0, spread=0.1)
    b = dataclasses.replace(TWO, step_s=0.014, setup_s=3.0, spread=0.3)
    m = merged([a, b])
    assert (m.step_s, m.setup_s, m.spread, m.runs) == (pytest.approx(0.012), 2.5, 0.3, 2)
    assert m.setup_spread == pytest.approx((3.0 - 2.0) / 2.5)  # measured, not the 20% of one run
    assert merged([a]).setup_spread == 0.2
