"""`hpctrain analyze RUN_DIR` for a run with profiler traces (profile.enabled=true): the
cross-rank trace summary (analysis/traces.py), checked against the step records."""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from hpctrain import bounded, records
from hpctrain.analysis.traces import RankTrace, agreement, rank_trace, straggler
from hpctrain.errors import RecordError

TRACE_GLOB = "rank*.pt.trace.json"


def has_traces(run_dir: Path) -> bool:
    return any((run_dir / "traces").glob(TRACE_GLOB))


def load_traces(run_dir: Path) -> list[RankTrace]:
    out = []
    for path in sorted((run_dir / "traces").glob(TRACE_GLOB)):
        rank = int(path.name.removeprefix("rank").split(".")[0])
        try:
            events = json.loads(bounded.read_bytes(path, bounded.TRACE))["traceEvents"]
            out.append(rank_trace(rank, events))
        except (OSError, ValueError, KeyError, TypeError, RecursionError) as e:
            raise RecordError(f"{path}: not a readable profiler trace ({e})") from e
    return out


def show_kernels(traces: list[RankTrace], console: Console) -> None:
    """The GPUs' side of the window, per rank: how busy the device was, NCCL's part of it and how
    much of that ran beside compute kernels, and the longest kernels over every rank."""
    table = Table(title="GPU kernels in the window: per rank")
    for col in ("rank", "busy", "of the window", "NCCL", "NCCL beside compute"):
        table.add_column(col, justify="right")
    for t in traces:
        overlap = t.nccl_overlapped_s / t.nccl_kernels_s if t.nccl_kernels_s else None
        table.add_row(
            str(t.rank),
            f"{t.kernels_s * 1e3:.2f} ms",
            f"{100 * t.kernels_s / t.window_s:.0f}%" if t.window_s else "-",
            f"{t.nccl_kernels_s * 1e3:.2f} ms",
            f"{100 * overlap:.0f}%" if overlap is not None else "-",
        )
    console.print(table)
    total: dict[str, float] = {}
    for t in traces:
        for name, sec in t.top_kernels:
            total[name] = total.get(name, 0.0) + sec
    for name, sec in sorted(total.items(), key=lambda kv: -kv[1])[:5]:
        console.print(f"  {sec * 1e3:9.2f} ms  {name[:100]}", highlight=False)


def show_traces(run_dir: Path, console: Console) -> int:
    traces = load_traces(run_dir)
    ms = 1e3
    table = Table(title=f"profiler window of {run_dir.name}: per rank, ms per step")
    for col in ("rank", "steps", "data", "compute", "comm", "operators", "overlapped", "idle", "vs records"):
        table.add_column(col, justify="right")
    for t in traces:
        n = max(len(t.steps), 1)
        try:
            recs = records.read_steps(run_dir / records.steps_file(t.rank))
        except RecordError:
            recs = []
        a = agreement(t, recs)
        share = t.overlap_share
        table.add_row(
            str(t.rank),
            f"{t.steps[0].step}-{t.steps[-1].step}" if t.steps else "-",
            f"{t.mean('data_s') * ms:.2f}",
            f"{t.mean('compute_s') * ms:.2f}",
            f"{t.mean('comm_s') * ms:.2f}",
            f"{t.operators_s / n * ms:.2f}",
            f"{100 * share:.0f}%" if share is not None else "-",
            f"{t.idle_s / n * ms:.2f}",
            f"{100 * a.worst():.1f}%" if a else "-",
        )
    console.print(table)
    console.print(
        "data, compute, comm: the trainer's phases in the trace (comm: exposed, as in the step records); "
        "operators: the main thread's torch operators; overlapped: the share of torch.distributed's "
        "collectives in flight while operators ran (-: none visible, e.g. Horovod's); idle: neither; "
        "vs records: the largest difference of data/compute/comm from the step records of the same "
        "steps, as a share of the step",
        highlight=False,
    )
    gpus = [t for t in traces if t.kernels_s]
    if gpus:
        show_kernels(gpus, console)
    slow = straggler(traces)
    if slow is not None:
        console.print(
            f"straggler: rank {slow[0]} ({slow[1] * ms:.2f} ms per step more data + compute than the fastest)",
            highlight=False,
        )
    if (run_dir / "traces" / "horovod_timeline.json").exists():
        console.print(f"Horovod timeline: {run_dir / 'traces' / 'horovod_timeline.json'}", highlight=False)
    console.print(f"traces (chrome://tracing, Perfetto): {run_dir / 'traces'}", highlight=False)
    return 0
