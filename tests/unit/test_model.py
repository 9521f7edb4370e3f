"""The step-time model, the communication fit and roofline, and the intervals, against known
parameters and hand-computed values."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpctrain.analysis.model import CommModel, fit_comm_model, from_probe
from hpctrain.analysis.roofline import MIB, messages, roofline
from hpctrain.analysis.stepmodel import Scale, fit_step_model, spread
from hpctrain.analysis.uncertainty import MINMAX, NONE, T95, positive_interval, ratio_interval
from hpctrain.records import AllreduceRow
from tests.conftest import replace_summary

TRUTH = CommModel(alpha_s=20e-6, beta_s_per_byte=1e-9, latency_s=2e-3)


def _bench(noise: float, seed: int = 0) -> list[AllreduceRow]:
    """Allreduce timings of an engine with latency L over a wire with alpha, beta; multiplicative noise."""
    rng = np.random.default_rng(seed)
    wire = CommModel(TRUTH.alpha_s, TRUTH.beta_s_per_byte)
    return [
        AllreduceRow(
            n=n,
            bytes=b,
            iters=1,
            hvd_s=TRUTH.allreduce_s(n, b) * (1 + noise * rng.standard_normal()),
            mpi_s=wire.allreduce_s(n, b) * (1 + noise * rng.standard_normal()),
        )
        for n in (2, 4)
        for b in (2**k for k in range(10, 26, 2))
    ]


def test_comm_fit_recovers_wire_latency_bandwidth_and_engine_latency_from_noisy_timings() -> None:
    fit = fit_comm_model(_bench(noise=0.03), "hvd_s")
    assert fit is not None and not fit.problems()
    assert fit.alpha_s == pytest.approx(20e-6, rel=0.15)
    assert fit.beta_s_per_byte == pytest.approx(1e-9, rel=0.05)
    assert fit.latency_s == pytest.approx(2e-3, rel=0.05)
    # the engine's latency lies within three standard errors of its estimate
    assert abs(fit.latency_s - 2e-3) < 3 * fit.latency_se


def test_comm_fit_without_noise_is_exact_and_without_wire_timings_puts_all_latency_in_alpha() -> None:
    exact = fit_comm_model(_bench(noise=0.0), "hvd_s")
    assert exact is not None
    assert (exact.alpha_s, exact.beta_s_per_byte, exact.latency_s) == pytest.approx((20e-6, 1e-9, 2e-3))
    only = fit_comm_model([replace_summary(r, mpi_s=math.nan) for r in _bench(0.0) if r.n == 2], "hvd_s")
    # one world size, no wire: L + 2 alpha = 2.04 ms is all the fit can see
    assert only is not None and only.latency_s == 0 and 2 * only.alpha_s == pytest.approx(2.04e-3)


def test_a_runs_probe_gives_latency_and_bandwidth() -> None:
    # 4 ranks, 4 MiB: small 2 ms, full 2 ms + 1.5 x 4 MiB x 1 ns = 8.29 ms
    probe = from_probe(4, 4 * MIB, 2e-3, 2e-3 + 1.5 * 4 * MIB * 1e-9)
    assert probe is not None
    assert (probe.latency_s, probe.beta_s_per_byte) == pytest.approx((2e-3, 1e-9))
    assert from_probe(1, 4 * MIB, 0.0, 0.0) is None


def test_roofline_by_hand_on_both_sides_of_the_crossover() -> None:
    # 4 MiB on 4 ranks in one 64 MiB fusion buffer: latency 2 ms + 6 x 20 us = 2.12 ms;
    # bandwidth 2 x 3/4 x 4 MiB x 1 ns = 6.29 ms -> bandwidth-bound; 3 ms exposed of 8.41 ms
    big = roofline("horovod", "fusion", 4, 4 * MIB, 64 * MIB, 10, TRUTH, 3e-3)
    assert big is not None and big.messages == 1
    assert (big.latency_s, big.bandwidth_s) == pytest.approx((2.12e-3, 1.5 * 4 * MIB * 1e-9))
    assert big.overlap == pytest.approx(1 - 3e-3 / (2.12e-3 + 6.291456e-3))
    assert big.bound == "bandwidth" and "compression=fp16" in big.knob
    # 256 KiB: bandwidth 0.39 ms < latency 2.12 ms -> latency-bound; already one message
    small = roofline("horovod", "fusion", 4, MIB / 4, 64 * MIB, 10, TRUTH, 1e-3)
    assert small is not None and small.bound == "latency" and "cycle_time_ms" in small.knob
    # the crossover: latency = bandwidth at m = 2.12 ms / (1.5 ns) = 1.413 MB
    m_star = 2.12e-3 / 1.5e-9
    below = roofline("horovod", "fusion", 4, 0.99 * m_star, 64 * MIB, 10, TRUTH, 0.0)
    above = roofline("horovod", "fusion", 4, 1.01 * m_star, 64 * MIB, 10, TRUTH, 0.0)
    assert below is not None and above is not None and (below.bound, above.bound) == ("latency", "bandwidth")
    # DDP: 30 MiB in a 1 MiB first bucket and 25 MiB buckets: 1 + ceil(29 / 25) = 3 messages
    # waiting 10 ms for the slowest rank, more than the 8.41 ms the collective takes: imbalance first
    slow = roofline("horovod", "fusion", 4, 4 * MIB, 64 * MIB, 10, TRUTH, 3e-3, "none", 10e-3)
    assert slow is not None and slow.imbalanced and "slowest one (load imbalance)" in slow.knob
    assert "plus 10.00 ms waiting for the slowest rank" in slow.line() and not big.imbalanced
    ddp = roofline("ddp", "buckets", 4, 30 * MIB, 25 * MIB, 10, CommModel(20e-6, 0.0, 5e-3), 0.0)
    assert ddp is not None and ddp.messages == 3 and ddp.bound == "latency" and "bucket_mb" in ddp.knob
    assert ddp.latency_s == pytest.approx(3 * (5e-3 + 6 * 20e-6))
    assert messages("fusion", 30 * MIB, 0, 12) == 12  # fusion off: a message per tensor
    assert roofline("horovod", "fusion", 1, 4 * MIB, 64 * MIB, 10, TRUTH, 0.0) is None


def test_fsdp_units_are_one_and_a_half_all_reduces_on_the_wire_by_hand() -> None:
    """FSDP resharded after forward: per unit two all-gathers and a reduce-scatter, each (n-1)/n of
    the unit's bytes in n-1 steps: 3 (n-1)/n m against an all-reduce's 2 (n-1)/n m (Rajbhandari
    et al. 2020, section 7). 4 MiB in 5 units on 4 ranks, per collective 2 ms + 6 x 20 us:
    latency 1.5 x 5 x 2.12 ms = 15.9 ms; bandwidth 3 x 3/4 x 4 MiB x 1 ns = 9.437 ms."""
    fsdp = roofline("ddp", "shards", 4, 4 * MIB, 0, 5, TRUTH, 4e-3)
    assert fsdp is not None and fsdp.messages == 5  # one group per unit, whatever the bucket size
    assert fsdp.latency_s == pytest.approx(1.5 * 5 * 2.12e-3)
    assert fsdp.bandwidth_s == pytest.approx(3 * 0.75 * 4 * MIB * 1e-9)
    assert fsdp.overlap == pytest.approx(1 - 4e-3 / (15.9e-3 + 3 * 0.75 * 4 * MIB * 1e-9))
    assert fsdp.bound == "latency" and "shard coarser units (parallelism.shard.modules; 5 now)" in fsdp.knob
    assert "1.5x an all-reduce" in fsdp.grouping
    # 64 MiB in one unit: bandwidth 3 x 3/4 x 64 MiB x 1 ns = 151 ms > latency 1.5 x 2.12 ms
    big = roofline("ddp", "shards", 4, 64 * MIB, 0, 1, TRUTH, 0.0)
    assert big is not None and big.bound == "bandwidth" and "reshard_after_forward=false" in big.knob


def _scales(
    f: float, noise: float = 0.0, seed: int = 1, threads: tuple[int, ...] = (), jitter: float = 0.0
) -> list[Scale]:
    """Weak scaling, 64 samples per rank, 2 us compute per sample, 4 MiB gradients; with jitter,
    the ranks' busy times vary by that share, and each step waits for the slowest of n."""
    rng = np.random.default_rng(seed)
    out = []
    for i, n in enumerate((1, 2, 4, 8)):
        comm = f * TRUTH.allreduce_s(n, 4 * MIB) * (1 + noise * rng.standard_normal())
        compute, other = 64 * 2e-6, 1e-3
        wait = jitter * spread(n) * (compute + other)
        out.append(
            Scale(
                n,
                64,
                threads[i] if threads else 1,
                compute,
                comm,
                other,
                0.0,
                compute + comm + other + wait,
                wait_s=wait,
            )
        )
    return out


def test_step_model_recovers_the_exposed_share_and_predicts_held_out_scales() -> None:
    model = fit_step_model(TRUTH, 4 * MIB, 1, _scales(0.4, noise=0.05))
    assert model.described
    assert model.exposed == pytest.approx(0.4, abs=0.03) and abs(model.exposed - 0.4) < 3 * model.exposed_se
    assert all(abs(c.in_sample_err) < 0.05 for c in model.checks)
    assert all(abs(c.loo_err) < 0.10 for c in model.checks)  # 5% noise on a term that is 3/4 of a step
    exact = fit_step_model(TRUTH, 4 * MIB, 1, _scales(0.4))
    assert [c.loo_err for c in exact.checks] == pytest.approx([0, 0, 0, 0], abs=1e-12)


def test_expected_largest_of_n_normals_and_the_wait_for_the_slowest_rank() -> None:
    # exact E[max of n standard normals]: 0.5642 (n=2), 1.0294 (4), 1.4236 (8), 1.7660 (16); Blom's
    # approximation is within 5%
    for n, exact in ((2, 0.5642), (4, 1.0294), (8, 1.4236), (16, 1.7660)):
        assert spread(n) == pytest.approx(exact, rel=0.05)
    assert spread(1) == 0
    # 10% jitter on a 1.128 ms busy step: the held-out N=4 and N=8 waits follow from N=2's
    model = fit_step_model(TRUTH, 4 * MIB, 1, _scales(0.4, jitter=0.10))
    assert model.described and model.exposed == pytest.approx(0.4)  # the wait is not communication
    for c in model.checks[1:]:
        assert c.held_out is not None
        assert c.held_out.wait_s == pytest.approx(0.10 * spread(c.scale.n) * 1.128e-3)
        assert c.loo_err == pytest.approx(0, abs=1e-12)
    assert (
        model.checks[0].held_out is not None and model.checks[0].held_out.wait_s == 0
    )  # one rank waits for none
    # when the other scales' jitter is off, leave-one-out names load imbalance as the term
    scales = _scales(0.4, jitter=0.10)
    scales[3] = replace_summary(
        scales[3], wait_s=4 * scales[3].wait_s, step_s=scales[3].step_s + 3 * scales[3].wait_s
    )
    last = fit_step_model(TRUTH, 4 * MIB, 1, scales).checks[3]
    assert last.term == "load imbalance" and "waiting for the slowest rank" in last.why


def test_a_share_above_one_means_the_model_does_not_describe_the_runs() -> None:
    model = fit_step_model(TRUTH, 4 * MIB, 1, _scales(1.8, noise=0.02))
    assert not model.described and "1.80x" in model.problems[0].replace("1.79x", "1.80x").replace(
        "1.81x", "1.80x"
    )
    assert model.exposed == 1.0 and model.exposed_raw == pytest.approx(1.8, abs=0.05)


def test_leave_one_out_names_the_compute_term_when_threads_per_rank_change() -> None:
    # locally: 1 rank has 2 threads and computes twice as fast per sample as the 2-rank runs (1 thread)
    scales = _scales(0.5, threads=(2, 1, 1, 1))
    fast = scales[0]
    scales[0] = Scale(1, 64, 2, fast.compute_s / 2, 0.0, fast.other_s, 0.0, fast.compute_s / 2 + fast.other_s)
    model = fit_step_model(TRUTH, 4 * MIB, 1, scales)
    first = model.checks[0]
    assert first.term == "compute" and "from N=2 with 1 thread(s) per rank; N=1 ran 2" in first.why
    # compute from N=2 (0.128 ms) where N=1 measured 0.064 ms: +0.064 ms on a 1.064 ms step
    # (N=1 has no communication, so the overlap fitted on the others does not enter)
    assert first.loo_err == pytest.approx(0.064 / 1.064, rel=1e-6)


def test_intervals_by_hand() -> None:
    # logs of 10, 20, 40: mean ln 20, sd ln 2, half = 4.3027 x ln 2 / sqrt 3
    i = positive_interval([10, 20, 40])
    half = 4.3027 * math.log(2) / math.sqrt(3)
    assert i.method == T95 and (i.lo, i.hi) == pytest.approx((20 * math.exp(-half), 20 * math.exp(half)))
    two = positive_interval([640, 800])
    assert (two.lo, two.hi, two.method) == (640, 800, MINMAX)
    assert positive_interval([5.0]).method == NONE
    # speedup of 800 (min-max 700..900) over 400 (exact): 1.75 .. 2.25
    s = ratio_interval(800, positive_interval([700, 900]), 400, positive_interval([400]))
    assert (s.lo, s.hi) == pytest.approx((1.75, 2.25))


positive = st.floats(min_value=1e-6, max_value=1e9, allow_nan=False, allow_infinity=False)


@settings(max_examples=300, deadline=None)
@given(st.lists(positive, min_size=1, max_size=12), st.lists(positive, min_size=1, max_size=12))
def test_no_interval_of_a_positive_quantity_reaches_below_zero(num: list[float], den: list[float]) -> None:
    a, b = positive_interval(num), positive_interval(den)
    s = ratio_interval(float(np.mean(num)), a, float(np.mean(den)), b)
    for i in (a, b, s, s.scaled(0.25)):
        assert not i.known or 0 < i.lo <= i.hi


def test_a_synthetic_study_with_noise_gives_back_its_engine_and_overlap(tmp_path: Path) -> None:
    from hpctrain.analysis.analyze import analyze_dir
    from hpctrain.bench.analyze import SYNTHETIC_COMM, SYNTHETIC_EXPOSED, SYNTHETIC_JITTER, synthetic_study

    a = analyze_dir(synthetic_study(tmp_path / "s", 32))
    [s] = a.series
    assert s.comm is not None and s.step_model is not None and s.step_model.described
    assert s.comm.latency_s == pytest.approx(SYNTHETIC_COMM.latency_s, rel=0.1)
    assert s.comm.bandwidth_bytes_per_s == pytest.approx(1e9, rel=0.05)
    assert s.step_model.exposed == pytest.approx(SYNTHETIC_EXPOSED, abs=0.03)
    # 5% noise on compute and communication; compute per sample carried between scales is not
    # constant (Amdahl's serial part), so held-out scales miss by more than the noise, but < 15%
    assert all(abs(c.loo_err) < 0.15 for c in s.step_model.checks if c.held_out)
    assert len(s.predictions) == 3 and all(q.band == s.step_model.loo_band for q in s.predictions)
    # the wait for the slowest rank is measured apart from communication and predicted for held-out
    # scales from the others' jitter (2% of the busy time), within the 5% noise of that busy time
    for p, c in zip(s.points[1:], s.step_model.checks[1:]):
        truth = SYNTHETIC_JITTER * spread(p.n) * (p.compute_s + p.data_s)
        assert p.imbalance_s == pytest.approx(truth, rel=1e-9)
        assert c.held_out is not None and c.held_out.wait_s == pytest.approx(truth, rel=0.08)


def test_the_tensor_parallel_roofline_by_hand() -> None:
    """A probe of 1 ms for one value and 3 ms for 4 MiB over 4 ranks: latency 1 ms per
    collective, beta = 2 ms / (2 * 3/4 * 4 MiB). TP 2 with 10 collectives and 1 MiB of all-reduce
    bytes: latency 10 * 1 ms, bandwidth 2 * 1/2 * 1 MiB * beta = 1/3 ms."""

    from hpctrain.bench.analyze import synthetic_summary
    from hpctrain.parallel.tensor.report import for_tensor_parallel

    s = synthetic_summary(4, 64, step=0.05, compute=0.04, comm=0.005, data=0.005, parameters=MIB)
    s = replace_summary(s, probe_small_s=1e-3, probe_full_s=3e-3, tp_degree=2, tp_messages=10, tp_bytes=MIB)
    assert s.grad_bytes == 4 * MIB
    tp = for_tensor_parallel(s)
    assert tp is not None
    assert tp.latency_s == pytest.approx(10e-3) and tp.bandwidth_s == pytest.approx(1e-3 / 3)
    assert tp.bound == "latency" and "a larger batch per rank" in tp.knob
    assert (
        "10 collective(s) per step over 2 ranks, 1.00 MiB" in tp.line()
        and "all exposed: 26% of the step's compute" in tp.line()
    )
    # replayed alone after training: the measured time is the exposed one (8 ms: 20% of 40 ms)
    measured = for_tensor_parallel(replace_summary(s, tp_comm_s=8e-3))
    assert measured is not None and measured.exposed_s == 8e-3 and measured.share == pytest.approx(0.2)
    assert "measured 8.00 ms replayed alone (0.77x), all exposed: 20% of" in measured.line()
    assert for_tensor_parallel(replace_summary(s, tp_messages=0)) is None  # not counted
    assert for_tensor_parallel(replace_summary(s, tp_degree=1)) is None
