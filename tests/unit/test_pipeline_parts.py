"""A pipeline step's parts against hand-computed values: a wait split into transfer (the link's
alpha + beta * bytes) and idle, the per-rank and run means, the pipeline roofline's bound and
advice; and the schedule functions the meter wraps still exist in the installed torch."""

from __future__ import annotations

import dataclasses

import pytest
import torch.distributed as dist

from hpctrain import records
from hpctrain.engine.clock import HostClock
from hpctrain.parallel.pipeline.figures import PipelineRank, PipelineStep
from hpctrain.parallel.pipeline.p2p import Link, Meter, install
from hpctrain.parallel.pipeline.report import for_pipeline, pipe
from hpctrain.parallel.tensor.figures import TensorRank
from hpctrain.records import RankSummary, StepRecord
from hpctrain.records.parts import part
from hpctrain.train.stats import rank_stats, summarize
from tests.conftest import replace_summary


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
    m.waited(works, 1.0, 1.0005)  # host clock marks: a wait of 0.5 ms
    m.settle(HostClock())
    assert m.traffic.transfer_s == pytest.approx(0.0002)
    assert m.traffic.idle_s == pytest.approx(0.0003)
    assert (m.traffic.bytes, m.traffic.messages) == (100_000, 1)


def test_a_wait_shorter_than_the_link_time_is_all_transfer() -> None:
    m = Meter(LINK)
    sends: list[object] = []
    recvs: list[object] = []
    m.posted([Op(dist.isend, Tensor(250_000))], sends)  # 1 MB: 1.1 ms
    m.posted([Op(dist.irecv, Tensor(250)), Op(dist.isend, Tensor(250))], recvs)  # 1 kB each way: 101 us
    m.waited(sends, 2.0, 2.0004)  # the bytes were mostly on their way already
    m.waited(recvs, 3.0, 3.0003)
    assert m.traffic.wait_s == 0.0  # read once the step has settled, not before
    m.settle(HostClock())
    assert m.traffic.transfer_s == pytest.approx(0.0004 + 0.000101)
    assert m.traffic.idle_s == pytest.approx(0.0003 - 0.000101)
    assert m.traffic.bytes == 1_002_000
    m.reset()
    assert (m.traffic.wait_s, m.traffic.bytes) == (0.0, 0)


def test_waiting_on_nothing_posted_counts_nothing() -> None:
    m = Meter(LINK)
    m.waited([], 0.0, 0.001)
    m.settle(HostClock())
    assert m.traffic.wait_s == 0.0 and m.traffic.messages == 0


def test_the_schedules_wait_through_the_functions_the_meter_wraps() -> None:
    from torch.distributed.pipelining import schedules

    before = schedules._batch_p2p, schedules._wait_batch_p2p
    try:
        install(Meter(LINK), HostClock())
        install(Meter(LINK), HostClock())  # installed twice: still one wrapper around torch's own
        assert schedules._batch_p2p.__wrapped__ is before[0]
        assert schedules._wait_batch_p2p.__wrapped__ is before[1]
    finally:
        schedules._batch_p2p, schedules._wait_batch_p2p = before


def _step(step: int, compute_s: float, step_s: float, **pipeline: float) -> StepRecord:
    base = dict(loss=1.0, lr=0.1, data_s=0.001, comm_s=0.0, samples=32, samples_per_s=1.0, timed=True)
    rec = StepRecord(step=step, rank=0, compute_s=compute_s, step_s=step_s, **base)  # type: ignore[arg-type]
    return replace_summary(rec, **pipeline)  # type: ignore[no-any-return]


LINK_FIGURES = {"pipeline": {"p2p_alpha_s": 1e-4, "p2p_beta_s_per_byte": 1e-9}}


def _pipeline_summary(bubble: float, transfer: float, schedule: float, compute: float) -> object:
    steps = [
        _step(1, compute_s=compute, step_s=0.1, bubble_s=bubble, transfer_s=transfer, schedule_s=schedule, p2p_bytes=8192),
        _step(2, compute_s=compute, step_s=0.1, bubble_s=bubble, transfer_s=transfer, schedule_s=schedule, p2p_bytes=8192),
    ]  # fmt: skip
    ranks = [
        replace_summary(rank_stats(steps, 0, "h", 1, 10, figures=LINK_FIGURES), rank=r, stage=r)
        for r in (0, 1)
    ]
    return summarize(
        ranks, 32, model="mlp", precision="fp32", backend="gloo", compression="none",
        parts={"pipeline": {"stages": 2, "microbatches": 4, "schedule": "gpipe"}}, started=0.0, finished=1.0,
    )  # fmt: skip


def test_run_summary_carries_the_parts_and_the_link() -> None:
    f = pipe(_pipeline_summary(0.02, 0.005, 0.01, 0.05))
    assert (f.stages, f.microbatches, f.schedule) == (2, 4, "gpipe")
    assert (f.bubble_s, f.transfer_s, f.schedule_s) == pytest.approx((0.02, 0.005, 0.01))
    assert (f.bubble_share, f.transfer_share, f.schedule_share) == pytest.approx((0.2, 0.05, 0.1))
    assert (f.p2p_bytes, f.p2p_alpha_s, f.p2p_beta_s_per_byte) == pytest.approx((8192, 1e-4, 1e-9))


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
    assert for_pipeline(replace_summary(s, stages=1)) is None
    assert for_pipeline(replace_summary(s, transfer_s=0.0, schedule_s=0.0)) is None  # older records


def test_rank_summary_defaults_keep_older_records_readable() -> None:
    r = RankSummary(
        rank=0, host="h", timed_steps=1, wall_s=1.0, step_s=1.0, step_p50_s=1.0, step_p95_s=1.0,
        data_s=0.0, compute_s=1.0, comm_s=0.0, first_loss=1.0, last_loss=1.0, peak_memory_bytes=1, parameters=1,
    )  # fmt: skip
    assert r.parts == {} and part(r, PipelineRank) == PipelineRank()


def test_an_older_pipeline_rank_and_step_read_into_their_parts() -> None:
    """Records written before the ranks and steps had parts: their flat pipeline and tensor
    figures move into the parts (the one migration); a data-parallel rank's zeros make none."""
    rank = records.to_dict(_pipeline_summary(0.02, 0.005, 0.01, 0.05).per_rank[1])
    old = {k: v for k, v in rank.items() if k != "parts"} | {
        "stage": 1, "bubble_s": 0.02, "transfer_s": 0.005, "schedule_s": 0.01, "p2p_bytes": 8192.0,
        "pipe_s": 0.09, "p2p_alpha_s": 1e-4, "p2p_beta_s_per_byte": 1e-9, "tp_messages": 3, "tp_bytes": 96.0,
        "tp_comm_s": 0.0,
    }  # fmt: skip
    r = records.from_dict(RankSummary, old)
    assert part(r, PipelineRank) == PipelineRank(1, 0.02, 0.005, 0.01, 8192.0, 0.09, 1e-4, 1e-9)
    assert part(r, TensorRank) == TensorRank(messages=3, bytes=96.0)
    data_parallel = {k: v for k, v in old.items() if not k.startswith(("tp_", "p2p_"))}
    data_parallel |= {"stage": 0, "bubble_s": 0.0, "transfer_s": 0.0, "schedule_s": 0.0, "pipe_s": 0.0}
    assert records.from_dict(RankSummary, data_parallel).parts == {}
    step = records.to_dict(_step(1, 0.05, 0.1))
    step = {k: v for k, v in step.items() if k != "parts"}
    again = records.from_dict(StepRecord, step | {"bubble_s": 0.02, "p2p_bytes": 64, "pipe_s": 0.09})
    assert again.parts == {"pipeline": PipelineStep(bubble_s=0.02, p2p_bytes=64, pipe_s=0.09)}
    assert records.from_dict(StepRecord, step | {"bubble_s": 0.0, "pipe_s": 0.0}).parts == {}
    with pytest.raises(records.RecordError, match=r"parts.pipeline.p2p_bytes: expected an integer"):
        records.from_dict(StepRecord, step | {"p2p_bytes": "many"})


def _staged(m: int, pipe: float, ranks: list[tuple[float, float, float, float]]) -> object:
    """A 2-stage gpipe run summary: per rank (pipe_s, bubble_s, transfer_s, schedule_s)."""
    s = _pipeline_summary(0.0, 0.0, 0.0, 0.0)
    per = [
        replace_summary(s.per_rank[0], rank=k, stage=k, pipe_s=p, bubble_s=b, transfer_s=t, schedule_s=o)
        for k, (p, b, t, o) in enumerate(ranks)
    ]
    mean = lambda i: sum(r[i] for r in ranks) / len(ranks)  # noqa: E731
    return replace_summary(
        s, per_rank=per, microbatches=m, pipe_s=pipe, step_s=pipe + 0.05,
        bubble_s=mean(1), transfer_s=mean(2), schedule_s=mean(3),
        p2p_bytes=8 * 1024, p2p_alpha_s=1e-4, p2p_beta_s_per_byte=0.0,
    )  # fmt: skip


def test_the_theory_with_the_stages_as_measured() -> None:
    from hpctrain.parallel.pipeline.report import stage_compute, theory_measured

    # m = 4; stage 0 computes 40 ms per step (10 per micro-batch), stage 1 80 ms (20):
    # T = 10 + 20 + 3 x 20 = 90 ms; idle 90 - 40 = 50 and 90 - 80 = 10: mean 30 / 90 = 1/3
    s = _staged(4, 0.1, [(0.1, 0.055, 0.002, 0.003), (0.1, 0.015, 0.002, 0.003)])
    assert stage_compute(s) == pytest.approx([0.010, 0.020])
    assert theory_measured(s) == pytest.approx(1 / 3)
    even = _staged(4, 0.1, [(0.1, 0.035, 0.002, 0.003), (0.1, 0.035, 0.002, 0.003)])
    assert theory_measured(even) == pytest.approx(1 / 5)  # equal stages: (p - 1)/(m + p - 1)
    assert theory_measured(replace_summary(s, schedule="zbv")) is None


def test_the_step_predicted_at_other_micro_batch_counts() -> None:
    from hpctrain.parallel.pipeline.report import best_microbatches, predict_step

    # from m = 4: stages 10 and 20 ms per micro-batch (40 and 80 ms per step), overhead 3 ms per
    # step (0.75 per micro-batch), link 100 us per message and no per-byte cost (2 a micro-batch),
    # 50 ms of update, data and loss
    s = _staged(4, 0.1, [(0.1, 0.055, 0.002, 0.003), (0.1, 0.015, 0.002, 0.003)])
    slot = lambda c, m: c * 4 / m + 2e-4 + 0.00075  # noqa: E731
    for m in (1, 2, 4, 8):
        a, b = slot(0.010, m), slot(0.020, m)
        assert predict_step(s, m) == pytest.approx(a + b + (m - 1) * b + 0.05), m
    # T(m) = 0.04/m + 0.00095 m + 0.13095: more micro-batches shrink the fill, each adds overhead
    # and messages; the minimum is near m = sqrt(0.04 / 0.00095) = 6.5, so 8 of the powers of 2
    best = best_microbatches(s, [1, 2, 4, 8, 16, 32])
    assert best is not None and best[0] == 8 and best[1] == pytest.approx(0.04 / 8 + 0.00095 * 8 + 0.13095)
    assert predict_step(replace_summary(s, schedule="interleaved_zb"), 4) is None


def test_a_study_at_several_micro_batch_counts_gets_the_predicted_best() -> None:
    from hpctrain.parallel.pipeline.report import predict_step, study_lines

    four = _staged(4, 0.1, [(0.1, 0.055, 0.002, 0.003), (0.1, 0.015, 0.002, 0.003)])
    eight = replace_summary(four, microbatches=8, step_s=0.2)
    one = replace_summary(four, microbatches=1, step_s=0.3, world_size=2)
    [line] = study_lines([one, four, eight, replace_summary(four, schedule="zbv", microbatches=2)])
    # counts 1, 4, 8: fitted on 4; candidates add the powers of two dividing the batch of 32
    err1 = 100 * (predict_step(four, 1) / 0.3 - 1)
    err8 = 100 * (predict_step(four, 8) / 0.2 - 1)
    assert line == (
        f"N=2 horovod gpipe: from m=4 the model predicts m=8 fastest ({1e3 * predict_step(four, 8):.2f} ms); "
        f"measured fastest m=4 (150.00 ms); its error at m=1 {err1:+.1f}%, m=8 {err8:+.1f}%"
    )
