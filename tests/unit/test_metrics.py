"""Scaling formulas against hand-computed values, including a published figure."""

from __future__ import annotations

import math

import pytest

from hpctrain.analysis import metrics as m
from hpctrain.analysis.model import CommModel, fit_alpha_beta


def test_horovod_published_efficiency_512_gpus() -> None:
    """Horovod's README: ~90% scaling efficiency for ResNet-101 on 512 GPUs (weak scaling).
    With X_1 = 100 img/s per GPU, 90% means X_512 = 0.9 * 512 * 100 = 46,080 img/s."""
    x1, x512 = 100.0, 46_080.0
    assert m.efficiency(x512, x1, 512) == pytest.approx(0.90)
    s = m.speedup(x512, x1)
    assert s == pytest.approx(460.8)
    # Karp-Flatt by hand: (1/460.8 - 1/512) / (1 - 1/512) = 0.00021701 / 0.99804688 = 2.1744e-4
    assert m.karp_flatt(s, 512) == pytest.approx(2.1744e-4, rel=1e-3)


def test_megatron_lm_published_efficiency_512_gpus() -> None:
    """A published figure, not built from its own answer. Shoeybi et al. 2019, "Megatron-LM"
    (arXiv:1909.08053): 15.1 PFLOP/s sustained on 512 GPUs against 39 TFLOP/s on one GPU, "76%
    scaling efficiency" (weak scaling: the model grows with the GPUs)."""
    e = m.efficiency(15.1e15, 39e12, 512)
    assert e == pytest.approx(15.1e15 / (512 * 39e12)) and e == pytest.approx(0.7562, abs=1e-4)
    assert round(100 * e) == 76


def test_strong_scaling_by_hand() -> None:
    # global batch 64, 100 ms per step on 1 rank, 60 ms on 2: E = 100 / (2 * 60) = 0.8333, S = 1.6667
    assert m.efficiency(64 / 0.060, 64 / 0.100, 2) == pytest.approx(0.83333, rel=1e-4)
    # Karp-Flatt: (1/1.6667 - 1/2) / (1 - 1/2) = (0.6 - 0.5) / 0.5 = 0.2
    assert m.karp_flatt(0.100 / 0.060, 2) == pytest.approx(0.2)
    assert math.isnan(m.karp_flatt(1.0, 1))


def test_amdahl_and_its_fit() -> None:
    # s = 0.1: S(4) = 1 / (0.1 + 0.9/4) = 1 / 0.325 = 3.0769
    assert m.amdahl_speedup(0.1, 4) == pytest.approx(3.076923)
    ns = [2, 4, 8, 16]
    assert m.fit_amdahl(ns, [m.amdahl_speedup(0.05, n) for n in ns]) == pytest.approx(0.05)


def test_confidence_interval_by_hand() -> None:
    # values 10, 12, 14: mean 12, s = 2, t(0.975, 2) = 4.3027, half-width = 4.3027 * 2 / sqrt(3) = 4.968
    mean, half = m.mean_ci95([10, 12, 14])
    assert mean == 12 and half == pytest.approx(4.968, rel=1e-3)
    assert math.isnan(m.mean_ci95([5])[1])


def test_nccl_tests_bus_bandwidth() -> None:
    # 1 GiB in 0.5 s over 8 ranks: algbw 2 GiB/s, busbw = 2 * 2*7/8 = 3.5 GiB/s
    algbw, busbw = m.allreduce_bandwidths(2**30, 0.5, 8)
    assert algbw == pytest.approx(2 * 2**30) and busbw == pytest.approx(3.5 * 2**30)


def test_alpha_beta_fit_recovers_the_model() -> None:
    truth = CommModel(alpha_s=20e-6, beta_s_per_byte=1 / 5e9)
    samples = [
        (n, size, truth.allreduce_s(n, size)) for n in (2, 4, 8) for size in (2**k for k in range(10, 28, 2))
    ]
    fit = fit_alpha_beta(samples)
    assert fit.alpha_s == pytest.approx(20e-6, rel=1e-6)
    assert fit.bandwidth_bytes_per_s == pytest.approx(5e9, rel=1e-6)
    # ring allreduce by hand: 4 ranks, 1 MB: 2*3*20us + 2*3/4 * 1e6 B / 5e9 B/s = 120us + 300us
    assert truth.allreduce_s(4, 1e6) == pytest.approx(420e-6)


def test_t_quantiles_match_tables() -> None:
    assert m.t975(1) == 12.7062 and m.t975(30) == 2.0423
    assert m.t975(60) == pytest.approx(2.0003, abs=2e-4)  # table value
    assert m.t975(120) == pytest.approx(1.9799, abs=2e-4)


def test_alpha_beta_fit_holds_a_negative_within_its_uncertainty_at_zero() -> None:
    # bandwidth-only data (no latency at all, plus noise pulling alpha below 0)
    samples = [(2, s, s / 1e9 * 0.99 if s < 2**12 else s / 1e9) for s in (2**10, 2**12, 2**20, 2**24)]
    fit = fit_alpha_beta(samples)
    assert fit.alpha_s == 0 and fit.beta_s_per_byte == pytest.approx(1e-9, rel=0.02)
    assert not fit.problems()


def test_a_clearly_negative_latency_is_reported_not_hidden() -> None:
    # times that fall as messages grow at first: a line through them has a negative intercept far
    # beyond its uncertainty, which no physical network has
    samples = [(2, s, t) for s, t in ((2**20, 1.0e-3), (2**21, 2.5e-3), (2**22, 5.5e-3), (2**23, 11.5e-3))]
    fit = fit_alpha_beta(samples)
    assert fit.alpha_s < 0 and "latency α is negative" in fit.problems()[0]
