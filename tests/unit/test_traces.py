"""The cross-rank trace summary (analysis/traces.py) on hand-built Chrome traces whose every
figure is computed by hand below, and the profile/tracking settings' rules."""

from __future__ import annotations

import pytest

from hpctrain.analysis.traces import agreement, intersect, length, minus, rank_trace, straggler, union
from hpctrain.config import load_config
from hpctrain.config.validate import config_problems
from hpctrain.records import StepRecord


def test_span_arithmetic() -> None:
    assert union([(5, 7), (0, 2), (1, 3), (7, 8), (9, 9)]) == [(0, 3), (5, 8)]
    assert length([(0, 2), (1, 3)]) == 3
    assert intersect([(0, 3), (5, 8)], [(2, 6)]) == [(2, 3), (5, 6)]
    assert minus([(0, 10)], [(2, 3), (5, 6)]) == [(0, 2), (3, 5), (6, 10)]


def X(name: str, ts: float, dur: float, tid: int = 1, cat: str = "cpu_op") -> dict:
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "tid": tid, "cat": cat}


def mark(phase: str, step: int, ts: float, dur: float) -> dict:
    return X(f"hpctrain/{phase}#{step}", ts, dur, cat="user_annotation")


# one DDP step, in microseconds: data 0-100, compute 100-1100 (forward ops 100-400, backward ops
# 500-700 launching the gradient allreduce at 700, then waiting for it until 1000 in the reducer's
# final callback: 1000-1100 copies), comm 1100-1200, optimizer 1200-1500 (ops 1250-1450)
DDP_STEP = [
    mark("data", 3, 0, 100),
    mark("compute", 3, 100, 1000),
    mark("comm", 3, 1100, 100),
    mark("optimizer", 3, 1200, 300),
    X("aten::addmm", 100, 300),
    X("autograd::engine::evaluate_function: AddmmBackward0", 500, 200),
    X("c10d::allreduce_", 700, 20),
    X("gloo:all_reduce", 720, 380, tid=2, cat="user_annotation"),
    X("aten::copy_", 1000, 100),
    X("aten::add_", 1250, 200),
    {"ph": "M", "name": "thread_name", "tid": 1},
]


def test_a_ddp_step_splits_like_the_step_records() -> None:
    t = rank_trace(0, DDP_STEP)
    (s,) = t.steps
    # waits: from the last gradient collective's launch (700) to the end of compute (1100) = 400
    assert s.step == 3 and s.data_s == pytest.approx(100e-6)
    assert s.comm_s == pytest.approx((100 + 400) * 1e-6)
    assert s.compute_s == pytest.approx((1000 + 300 - 400) * 1e-6)
    assert t.window_s == pytest.approx(1500e-6)
    # operators: 300 + 200 + 20 + 100 + 200 (the c10d launch counts as a collective, not an op)
    assert t.operators_s == pytest.approx((300 + 200 + 100 + 200) * 1e-6)
    assert t.collectives_s == pytest.approx((20 + 380) * 1e-6)  # 700-720 and 720-1100
    assert t.overlapped_s == pytest.approx(100e-6)  # 1000-1100: the copies during the allreduce
    assert t.overlap_share == pytest.approx(100 / 400)
    # idle: 1500 - |ops 800 u collectives 400 (overlap 100) u comm mark 100| = 1500 - 1200
    assert t.idle_s == pytest.approx(300e-6)


@pytest.mark.parametrize(
    "damage",
    [{"dur": 1e300}, {"dur": -5}, {"dur": float("nan")}, {"ts": float("inf")}, {"dur": "x"}, {"ts": None}],
)
def test_a_damaged_event_is_left_out_and_the_rest_adds_up_as_before(damage: dict) -> None:
    """A `dur: 1e300` once made analyze print a 300-digit phase time."""
    bad = {**mark("optimizer", 3, 1200, 300), **damage}
    t = rank_trace(0, [*DDP_STEP, {**X("aten::mm", 1300, 100), **damage}, bad])
    assert t.window_s == pytest.approx(1500e-6) and t.operators_s == pytest.approx(800e-6)
    assert t.phases_s["optimizer"] == pytest.approx(300e-6)


def test_horovod_steps_have_only_their_comm_phase_and_agree_with_records() -> None:
    events = [
        mark("data", 0, 0, 50),
        mark("compute", 0, 50, 500),
        mark("comm", 0, 550, 250),
        mark("optimizer", 0, 800, 100),
    ]
    t = rank_trace(1, events)
    assert t.overlap_share is None  # Horovod's collectives leave no torch event
    rec = StepRecord(0, 1, 1.0, 0.1, 60e-6, 590e-6, 250e-6, 900e-6, 32, 1.0, True)
    a = agreement(t, [rec])
    assert a is not None and a.steps == 1
    assert a.compute_s == (pytest.approx(600e-6), pytest.approx(590e-6))
    assert a.worst() == pytest.approx(10e-6 / 900e-6)


def test_the_straggler_is_the_rank_with_the_most_data_and_compute() -> None:
    fast = rank_trace(0, [mark("data", 0, 0, 10), mark("compute", 0, 10, 100), mark("comm", 0, 110, 90)])
    slow = rank_trace(1, [mark("data", 0, 0, 10), mark("compute", 0, 10, 180), mark("comm", 0, 190, 10)])
    assert straggler([fast, slow]) == (1, pytest.approx(80e-6))
    assert straggler([fast]) is None


def test_a_trace_without_hpctrain_ranges_is_refused() -> None:
    with pytest.raises(ValueError, match="no hpctrain step ranges"):
        rank_trace(0, [X("aten::add", 0, 1)])


@pytest.mark.parametrize(
    ("overrides", "key", "words"),
    [
        (["profile.memory=true"], "profile.memory", "without profile.enabled=true"),
        (["profile.enabled=true", "train.steps=6"], "profile.steps", "the default: the 3 steps after"),
        (["profile.enabled=true", "profile.steps=[4,2]"], "profile.steps", "first <= last"),
        (["profile.enabled=true", "profile.steps=[3]"], "profile.steps", "must be [first, last]"),
        (["profile.enabled=true", "profile.ranks=[2]"], "profile.ranks", "rank 2 is not in [0, 1]"),
        (["tracking.uri=http://x:5000"], "tracking.uri", "does nothing without a tracker"),
        (["tracking=mlflow", "tracking.uri=mlflow.db"], "tracking.uri", "must be a URI"),
        (["tracking=tensorboard", "tracking.uri=http://x:5000"], "tracking.uri", "is MLflow's store"),
    ],
)
def test_bad_profile_and_tracking_settings_are_named(overrides: list[str], key: str, words: str) -> None:
    problems = config_problems(load_config(overrides), None)
    assert any(p.key == key and words in str(p) for p in problems), [str(p) for p in problems]


def test_a_timeline_is_asked_of_the_engine_that_records_one() -> None:
    """engine/registry.py: the Timeline capability, not the engine's name (issue 55)."""
    from hpctrain.engine.registry import engine_problems

    problems = engine_problems(
        load_config(["profile.enabled=true", "profile.horovod_timeline=true", "parallelism.engine=ddp"])
    )
    assert [str(p) for p in problems if p.key == "profile.horovod_timeline"] == [
        "profile.horovod_timeline: is a timeline engine ddp does not record (engines that do: horovod)\n"
        "    fix: drop profile.horovod_timeline (the torch.profiler trace shows torch.distributed's collectives)"
    ]


def test_good_profile_and_tracking_settings_pass() -> None:
    cfg = load_config(["profile.enabled=true", "profile.steps=[2,3]", "profile.ranks=[1]", "tracking=both"])
    assert not config_problems(cfg, None)
    assert cfg.profile.window(5) == (2, 3) and load_config([]).profile.window(5) == (5, 7)


def test_an_unreadable_trace_is_named(tmp_path) -> None:
    from hpctrain.commands.traces import load_traces
    from hpctrain.errors import RecordError

    (tmp_path / "traces").mkdir()
    (tmp_path / "traces" / "rank0.pt.trace.json").write_text('{"traceEvents": [')  # cut short
    with pytest.raises(RecordError, match=r"rank0\.pt\.trace\.json: not a readable profiler trace"):
        load_traces(tmp_path)


def test_gpu_kernels_are_summed_on_the_device_with_nccls_overlap() -> None:
    # the DDP step above, plus the device's kernels (us): a GEMM 150-450, a backward GEMM 500-800,
    # NCCL's all-reduce 700-1050 on its own stream (100 of it beside the backward GEMM), a kernel
    # outside the window (ignored)
    gpu = [
        X("ampere_sgemm_128x64_nn", 150, 300, tid=7, cat="kernel"),
        X("ampere_sgemm_128x64_tn", 500, 300, tid=7, cat="kernel"),
        X("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 700, 350, tid=8, cat="kernel"),
        X("ampere_sgemm_128x64_nn", 5000, 100, tid=7, cat="kernel"),
    ]
    t = rank_trace(0, DDP_STEP + gpu)
    assert t.kernels_s == pytest.approx((300 + 300 + 350 - 100) * 1e-6)  # 150-450, 500-1050
    assert t.nccl_kernels_s == pytest.approx(350e-6)
    assert t.nccl_overlapped_s == pytest.approx(100e-6)  # 700-800
    assert t.top_kernels[0] == ("ampere_sgemm_128x64_nn", pytest.approx(400e-6))  # over the whole trace
    assert rank_trace(0, DDP_STEP).kernels_s == 0.0  # a CPU run has none
