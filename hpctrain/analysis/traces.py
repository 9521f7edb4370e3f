"""The cross-rank trace summary: what each rank did inside the profiler's window, read from the
Chrome traces torch.profiler wrote (train/profile.py), and checked against the step records.

HolisticTraceAnalysis reads these traces too, but its breakdowns are built from GPU kernels; a
CPU run has none, so this module reads the traces' CPU events itself:
  steps, phases  the `hpctrain/<phase>#<step>` ranges the trainer marks (data, compute, comm,
                 optimizer, ...), so the trace and the step records divide a step the same way
  operators      the main thread's operators (cpu_op events), collectives left out
  collectives    torch.distributed's collectives in flight (gloo:, nccl:, c10d:: events); Horovod's
                 run outside torch and appear only as the comm phase (and in its own timeline)
  kernels        on GPUs, the device's own timeline: CUDA kernels (cat "kernel"), busy time in
                 the window, the NCCL kernels among them and how much of that ran beside compute
                 kernels (overlap on the device, where the host's view cannot see it)
Per step, exposed communication is the comm phase plus, as the DDP engine measures it, the
backward pass's time after it launched its last gradient collective (waiting for the buckets):
the records' comm_s. Compute is the rest of compute + optimizer: the records' compute_s."""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from hpctrain.records import StepRecord

MARK = re.compile(r"^hpctrain/(\w+)#(\d+)$")
COLLECTIVE = re.compile(r"^(gloo:|nccl:|mpi:|c10d::|record_param_comms)")
Span = tuple[float, float]  # start, end in microseconds


def union(spans: Iterable[Span]) -> list[Span]:
    """Sorted, merged, non-empty spans."""
    out: list[Span] = []
    for a, b in sorted(s for s in spans if s[1] > s[0]):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def length(spans: Iterable[Span]) -> float:
    return sum(b - a for a, b in union(spans))


def intersect(xs: Sequence[Span], ys: Sequence[Span]) -> list[Span]:
    """The parts of merged spans xs that lie inside merged spans ys."""
    out, j = [], 0
    for a, b in xs:
        while j < len(ys) and ys[j][1] <= a:
            j += 1
        k = j
        while k < len(ys) and ys[k][0] < b:
            out.append((max(a, ys[k][0]), min(b, ys[k][1])))
            k += 1
    return [s for s in out if s[1] > s[0]]


def minus(xs: Sequence[Span], ys: Sequence[Span]) -> list[Span]:
    """The parts of merged spans xs outside merged spans ys."""
    out = []
    for a, b in xs:
        cur = a
        for c, d in ys:
            if d <= cur or c >= b:
                continue
            if c > cur:
                out.append((cur, c))
            cur = max(cur, d)
        if cur < b:
            out.append((cur, b))
    return out


@dataclass
class StepPhases:
    """One profiled step, in seconds."""

    step: int
    data_s: float
    compute_s: float
    comm_s: float  # exposed: the comm phase + the main thread's waits for collectives in flight

    @property
    def step_s(self) -> float:
        return self.data_s + self.compute_s + self.comm_s


@dataclass
class RankTrace:
    rank: int
    window_s: float  # from the first profiled step's start to the last one's end
    steps: list[StepPhases]
    operators_s: float  # main-thread operators (collectives left out)
    collectives_s: float  # collectives in flight (0: none visible, e.g. Horovod's)
    overlapped_s: float  # of those, while the main thread ran operators
    idle_s: float  # neither an operator nor communication
    phases_s: dict[str, float] = field(default_factory=dict)  # every marked phase, summed
    kernels_s: float = 0.0  # GPU: kernels running (any stream), in the window; 0: no GPU kernels
    nccl_kernels_s: float = 0.0  # of those, NCCL's (the collectives on the device)
    nccl_overlapped_s: float = 0.0  # NCCL kernels running beside compute kernels
    top_kernels: list[tuple[str, float]] = field(default_factory=list)  # the longest, by total seconds

    @property
    def overlap_share(self) -> float | None:
        return self.overlapped_s / self.collectives_s if self.collectives_s else None

    def mean(self, what: str) -> float:
        return sum(getattr(s, what) for s in self.steps) / len(self.steps) if self.steps else 0.0


DAY_US = 86_400e6  # no event of a profiled window lasts a day: a longer one is damage


def _sane(e: dict[str, Any]) -> bool:
    """A complete event whose start and duration are finite numbers, the duration between 0 and a
    day (a damaged `dur: 1e300` once made a 300-digit phase time)."""
    try:
        ts, dur = float(e["ts"]), float(e["dur"])
    except (KeyError, TypeError, ValueError):
        return False
    return math.isfinite(ts) and 0.0 <= dur <= DAY_US


def rank_trace(rank: int, events: Sequence[dict[str, Any]]) -> RankTrace:
    """The summary of one rank's trace (events: its traceEvents)."""
    spans = [e for e in events if e.get("ph") == "X" and _sane(e)]
    marks: dict[int, dict[str, list[Span]]] = defaultdict(lambda: defaultdict(list))
    main_tid = None
    for e in spans:
        m = MARK.match(str(e.get("name", "")))
        if m:
            marks[int(m.group(2))][m.group(1)].append((float(e["ts"]), float(e["ts"]) + float(e["dur"])))
            main_tid = e.get("tid")
    if not marks:
        raise ValueError("no hpctrain step ranges in the trace (was it written by profile.enabled=true?)")
    window = union(s for phases in marks.values() for ss in phases.values() for s in ss)
    start, end = window[0][0], window[-1][1]
    ops, coll, launches, backward = [], [], [], []
    for e in spans:
        name, s = str(e.get("name", "")), (float(e["ts"]), float(e["ts"]) + float(e["dur"]))
        main = e.get("tid") == main_tid
        if COLLECTIVE.match(name):
            coll.append(s)
            if main and name.startswith("c10d::"):
                launches.append(s[0])
        elif e.get("cat") == "cpu_op" and main:
            ops.append(s)
            if name.startswith("autograd::engine::evaluate_function"):
                backward.append(s[0])
    launches.sort()
    backward.sort()
    ops_u = union(intersect(union(ops), [(start, end)]))
    comm_marks = union(s for phases in marks.values() for s in phases.get("comm", []))
    coll_u = union(intersect(union(coll), [(start, end)]))
    steps = [_step(k, marks[k], launches, backward) for k in sorted(marks)]
    busy = union([*ops_u, *coll_u, *comm_marks])
    totals: dict[str, float] = defaultdict(float)
    for phases in marks.values():
        for name, ss in phases.items():
            totals[name] += length(ss) / 1e6
    gpu = kernel_summary(spans, (start, end))
    return RankTrace(
        rank=rank,
        window_s=(end - start) / 1e6,
        steps=steps,
        operators_s=length(ops_u) / 1e6,
        collectives_s=length(coll_u) / 1e6,
        overlapped_s=length(intersect(coll_u, ops_u)) / 1e6,
        idle_s=max(0.0, (end - start) - length(busy)) / 1e6,
        phases_s=dict(totals),
        **gpu,
    )


NCCL_KERNEL = re.compile(r"nccl", re.IGNORECASE)


def kernel_summary(spans: Sequence[dict[str, Any]], window: Span, top: int = 5) -> dict[str, Any]:
    """The device's side of the window: kernel busy time, NCCL's share and its overlap with the
    other kernels (seconds), and the kernels that took longest in all."""
    kernels = [e for e in spans if e.get("cat") == "kernel"]
    if not kernels:
        return {}
    nccl: list[Span] = []
    compute: list[Span] = []
    by_name: dict[str, float] = defaultdict(float)
    for e in kernels:
        span = (float(e["ts"]), float(e["ts"]) + float(e["dur"]))
        (nccl if NCCL_KERNEL.search(str(e.get("name", ""))) else compute).append(span)
        by_name[str(e.get("name", ""))] += float(e["dur"]) / 1e6
    inside = [window]
    nccl_u, compute_u = union(intersect(union(nccl), inside)), union(intersect(union(compute), inside))
    return {
        "kernels_s": length([*nccl_u, *compute_u]) / 1e6,
        "nccl_kernels_s": length(nccl_u) / 1e6,
        "nccl_overlapped_s": length(intersect(nccl_u, compute_u)) / 1e6,
        "top_kernels": sorted(by_name.items(), key=lambda kv: -kv[1])[:top],
    }


def _step(
    step: int, phases: dict[str, list[Span]], launches: list[float], backward: list[float]
) -> StepPhases:
    compute = union(s for name, ss in phases.items() if name not in ("data", "comm") for s in ss)
    waits = 0.0
    for cs, ce in phases.get("compute", []):
        # like the engine's own measure (engine/ddp.py): the backward pass's time after its last
        # gradient collective was launched, which it spent waiting for the collectives
        back = [t for t in backward if cs <= t <= ce]
        grads = [t for t in launches if back and back[0] <= t <= ce]
        waits += ce - grads[-1] if grads else 0.0
    comm = length(phases.get("comm", []))
    return StepPhases(
        step=step,
        data_s=length(phases.get("data", [])) / 1e6,
        compute_s=(length(compute) - waits) / 1e6,
        comm_s=(comm + waits) / 1e6,
    )


@dataclass(frozen=True)
class Agreement:
    """How far the trace's phases of the profiled steps lie from the step records' (seconds per
    step, mean over the steps both hold)."""

    rank: int
    steps: int
    data_s: tuple[float, float]  # (trace, records)
    compute_s: tuple[float, float]
    comm_s: tuple[float, float]

    def worst(self) -> float:
        """The largest difference, as a share of the records' step time."""
        step = sum(r for _, r in (self.data_s, self.compute_s, self.comm_s)) or 1.0
        return max(abs(t - r) for t, r in (self.data_s, self.compute_s, self.comm_s)) / step


def agreement(trace: RankTrace, recs: Sequence[StepRecord]) -> Agreement | None:
    by_step = {r.step: r for r in recs}
    both = [s for s in trace.steps if s.step in by_step]
    if not both:
        return None
    n = len(both)

    def pair(t: str, r: str) -> tuple[float, float]:
        return sum(getattr(s, t) for s in both) / n, sum(getattr(by_step[s.step], r) for s in both) / n

    return Agreement(
        trace.rank, n, pair("data_s", "data_s"), pair("compute_s", "compute_s"), pair("comm_s", "comm_s")
    )


def straggler(traces: Sequence[RankTrace]) -> tuple[int, float] | None:
    """The rank with the most data + compute per step, and by how much it exceeds the least
    (seconds per step): the one the others wait for in every collective."""
    if len(traces) < 2:
        return None
    busy = {t.rank: t.mean("data_s") + t.mean("compute_s") for t in traces}
    slow = max(busy, key=lambda r: busy[r])
    return slow, busy[slow] - min(busy.values())
