"""A pipeline step's parts against hand-computed values: a wait split into transfer (the link's
alpha + beta * bytes) and idle, the per-rank and run means, the pipeline roofline's bound and
advice; and the schedule functions the meter wraps still exist in the installed torch."""

from __future__ import annotations

import dataclasses

import pytest
import torch.distributed as dist

from hpctrain.analysis.pipeline import for_pipeline
from hpctrain.records import RankSummary, StepRecord
from hpctrain.train.p2p import Link, Meter, install
from hpctrain.train.stats import rank_stats, summarize


@dataclasses.dataclass
class Op:  # what torch.distributed.P2POp carries that the meter reads
    op: object
    tensor: object


class Tensor:
    def __init__(self, n: int) -> None:
        self.n = n

    def numel(self) -> int:
        return self.n

    def element_size(self) -> int:
        return 4


LINK = Link(alpha_s=1e-4, beta_s_per_byte=1e-9)  # 100 us + 1 ns per byte (1 GB/s)


def test_a_wait_longer_than_the_transfer_is_idle_beyond_it() -> None:
    m = Meter(LINK)
    works: list[object] = []
    m.posted([Op(dist.irecv, Tensor(25_000))], works)  # 100 kB: 100 us + 100 us
    m.waited(works, 0.0005)
    assert m.traffic.transfer_s == pytest.approx(0.0002)
    assert m.traffic.idle_s == pytest.approx(0.0003)
    assert (m.traffic.bytes, m.traffic.messages) == (100_000, 1)


def test_a_wait_shorter_than_the_link_time_is_all_transfer() -> None:
    m = Meter(LINK)
    sends: list[object] = []
    recvs: list[object] = []
    m.posted([Op(dist.isend, Tensor(250_000))], sends)  # 1 MB: 1.1 ms
    m.posted([Op(dist.irecv, Tensor(250)), Op(dist.isend, Tensor(250))], recvs)  # 1 kB each way: 101 us
    m.waited(sends, 0.0004)  # the bytes were mostly on their way already
    m.waited(recvs, 0.0003)
    assert m.traffic.transfer_s == pytest.approx(0.0004 + 0.000101)
    assert m.traffic.idle_s == pytest.approx(0.0003 - 0.000101)
    assert m.traffic.bytes == 1_002_000
    m.reset()
    assert (m.traffic.wait_s, m.traffic.bytes) == (0.0, 0)


def test_waiting_on_nothing_posted_counts_nothing() -> None:
    m = Meter(LINK)
    m.waited([], 0.001)
    assert m.traffic.wait_s == 0.0 and m.traffic.messages == 0


def test_the_schedules_wait_through_the_functions_the_meter_wraps() -> None:
    from torch.distributed.pipelining import schedules

    before = schedules._batch_p2p, schedules._wait_batch_p2p
    try:
        install(Meter(LINK))
        install(Meter(LINK))  # installed twice: still one wrapper around torch's own
        assert schedules._batch_p2p.__wrapped__ is before[0]
        assert schedules._wait_batch_p2p.__wrapped__ is before[1]
    finally:
        schedules._batch_p2p, schedules._wait_batch_p2p = before


def _step(step: int, **kw: float) -> StepRecord:
    base = dict(loss=1.0, lr=0.1, data_s=0.001, comm_s=0.0, samples=32, samples_per_s=1.0, timed=True)
    return StepRecord(step=step, rank=0, **{**base, **kw})  # type: ignore[arg-type]


def _pipeline_summary(bubble: float, transfer: float, schedule: float, compute: float) -> object:
    steps = [
        _step(1, compute_s=compute, step_s=0.1, bubble_s=bubble, transfer_s=transfer, schedule_s=schedule, p2p_bytes=8192),
        _step(2, compute_s=compute, step_s=0.1, bubble_s=bubble, transfer_s=transfer, schedule_s=schedule, p2p_bytes=8192),
    ]  # fmt: skip
    ranks = [
        dataclasses.replace(rank_stats(steps, 0, "h", 1, 10, link=(1e-4, 1e-9)), rank=r, stage=r)
        for r in (0, 1)
    ]
    return summarize(
        ranks, 32, model="mlp", precision="fp32", backend="gloo", compression="none",
        stages=2, microbatches=4, schedule="gpipe", started=0.0, finished=1.0,
    )  # fmt: skip


def test_run_summary_carries_the_parts_and_the_link() -> None:
    s = _pipeline_summary(0.02, 0.005, 0.01, 0.05)
    assert (s.bubble_s, s.transfer_s, s.schedule_s) == pytest.approx((0.02, 0.005, 0.01))
    assert (s.bubble_share, s.transfer_share, s.schedule_share) == pytest.approx((0.2, 0.05, 0.1))
    assert (s.p2p_bytes, s.p2p_alpha_s, s.p2p_beta_s_per_byte) == pytest.approx((8192, 1e-4, 1e-9))


def test_the_pipeline_roofline_names_the_part_that_bounds_it() -> None:
    roof = for_pipeline(_pipeline_summary(0.02, 0.005, 0.01, 0.03))
    assert roof is not None and roof.bound == "bubble"
    # 20% idle against gpipe's 20% at m=4: more micro-batches (m=8: 1/9 = 11%)
    assert roof.knob.startswith("more micro-batches (m=8: theory 11% idle)")
    assert roof.bytes_per_microbatch == 2048
    # 4 micro-batches, a message each way each: 8 x 100 us + 8192 B x 1 ns
    assert roof.link_s == pytest.approx(8e-4 + 8192e-9)
    idle = for_pipeline(_pipeline_summary(0.05, 0.005, 0.01, 0.03))
    assert idle is not None and "idle 2.5x what gpipe predicts" in idle.knob  # 50% against 20%
    sched = for_pipeline(_pipeline_summary(0.002, 0.005, 0.03, 0.03))
    assert sched is not None and sched.bound == "schedule overhead"
    assert sched.knob == "fewer, larger micro-batches: each costs 7.50 ms of schedule overhead"
    moving = for_pipeline(_pipeline_summary(0.002, 0.03, 0.005, 0.03))
    assert moving is not None and moving.bound == "transfers"
    busy = for_pipeline(_pipeline_summary(0.002, 0.003, 0.005, 0.03))
    assert busy is not None and busy.bound == "compute"


def test_no_pipeline_roofline_without_stages_or_parts() -> None:
    s = _pipeline_summary(0.02, 0.005, 0.01, 0.05)
    assert for_pipeline(dataclasses.replace(s, stages=1)) is None
    assert for_pipeline(dataclasses.replace(s, transfer_s=0.0, schedule_s=0.0)) is None  # older records


def test_rank_summary_defaults_keep_older_records_readable() -> None:
    r = RankSummary(
        rank=0, host="h", timed_steps=1, wall_s=1.0, step_s=1.0, step_p50_s=1.0, step_p95_s=1.0,
        data_s=0.0, compute_s=1.0, comm_s=0.0, first_loss=1.0, last_loss=1.0, peak_memory_bytes=1, parameters=1,
    )  # fmt: skip
    assert (r.transfer_s, r.schedule_s, r.p2p_bytes) == (0.0, 0.0, 0.0)
