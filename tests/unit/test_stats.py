"""Timing statistics against hand-computed values."""

from __future__ import annotations

import dataclasses

import pytest

from hpctrain.records import RankSummary, StepRecord
from hpctrain.train.stats import percentile, rank_stats, straggler_waits, summarize


def _rec(step: int, step_s: float, compute: float, comm: float, data: float, loss: float, timed: bool = True):
    return StepRecord(
        step=step,
        rank=0,
        loss=loss,
        lr=0.1,
        data_s=data,
        compute_s=compute,
        comm_s=comm,
        step_s=step_s,
        samples=32,
        samples_per_s=64 / step_s,
        timed=timed,
    )


def test_percentile_interpolates_like_numpy() -> None:
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([10, 20, 30, 40, 50], 95) == pytest.approx(48.0)
    assert percentile([7], 95) == 7


def test_rank_stats_exclude_warmup_steps() -> None:
    recs = [
        _rec(0, 9.0, 9, 0, 0, 3.0, timed=False),
        _rec(1, 0.10, 0.06, 0.03, 0.01, 2.0),
        _rec(2, 0.20, 0.12, 0.06, 0.02, 1.0),
    ]
    s = rank_stats(recs, 0, "h", 1024, 10)
    assert s.timed_steps == 2
    assert s.wall_s == pytest.approx(0.30)
    assert s.step_s == pytest.approx(0.15)
    assert (s.compute_s, s.comm_s, s.data_s) == pytest.approx((0.09, 0.045, 0.015))
    assert s.first_loss == 3.0 and s.last_loss == pytest.approx(2.0)


def test_summary_uses_the_slowest_rank_for_throughput() -> None:
    a = RankSummary(
        rank=0,
        host="h",
        timed_steps=10,
        wall_s=1.0,
        step_s=0.1,
        step_p50_s=0.1,
        step_p95_s=0.12,
        data_s=0.01,
        compute_s=0.06,
        comm_s=0.03,
        first_loss=2.0,
        last_loss=1.0,
        peak_memory_bytes=100,
        parameters=10,
    )
    b = dataclasses.replace(a, rank=1, wall_s=2.0, step_s=0.2, comm_s=0.13, peak_memory_bytes=200)
    c = dataclasses.replace(b, rank=2, host="g", topology="core.leaf2.g")
    s = summarize(
        [a, b, c],
        global_batch=64,
        started=0.0,
        finished=1.0,
        model="cnn",
        precision="fp32",
        backend="mpi",
        compression="none",
    )
    assert s.throughput_samples_per_s == pytest.approx(64 * 10 / 2.0)  # 320 samples/s
    assert s.throughput_per_rank == pytest.approx(320 / 3)
    assert s.step_s == pytest.approx(0.5 / 3)  # seconds throughout (was step_ms == 150)
    assert s.comm_s == pytest.approx(0.29 / 3)
    assert s.comm_share == pytest.approx(0.29 / 0.5)
    assert s.peak_memory_bytes == [100, 200, 200]
    assert (s.nodes, s.hosts) == (2, ["g", "h"])  # where it ran: each host once, sorted
    assert s.switches == ["core.leaf2"]  # SLURM's topology address without the node (h reported none)


def test_straggler_waits_by_hand() -> None:
    # busy (data + compute) of rank 0: 10, 14 ms; rank 1: 12, 11 ms -> slowest 12, 14
    # rank 0 waits (12-10 + 14-14)/2 = 1 ms, rank 1 (12-12 + 14-11)/2 = 1.5 ms; step 7 only rank 0 timed
    waits = straggler_waits([{0: 0.010, 1: 0.014, 7: 0.5}, {0: 0.012, 1: 0.011}])
    assert waits == pytest.approx([0.001, 0.0015])
    # their mean is max - mean, step by step: ((12 - 11) + (14 - 12.5)) / 2 = 1.25 ms
    assert sum(waits) / 2 == pytest.approx(0.00125)
    assert straggler_waits([{0: 0.01}, {1: 0.01}]) != straggler_waits(
        [{0: 0.01}, {1: 0.01}]
    )  # NaN: no common step
    one = dataclasses.replace(rank_stats([], 0, "h", 0, 1), wait_s=0.002)
    about = dict(started=0.0, finished=1.0, model="cnn", precision="fp32", backend="mpi", compression="none")
    both = summarize([one, dataclasses.replace(one, rank=1, wait_s=0.0)], 64, **about)
    assert both.imbalance_s == pytest.approx(0.001)  # the mean over ranks
