"""Per-rank timing statistics and the run summary rank 0 writes. Pure functions."""
from __future__ import annotations

import statistics
from typing import Any, Sequence


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default method), q in [0, 100]."""
    if not values:
        return float("nan")
    s = sorted(values)
    pos = (len(s) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def rank_stats(records: Sequence[dict[str, Any]], peak_memory_bytes: int) -> dict[str, Any]:
    """One rank's aggregate over its timed steps (warm-up steps excluded)."""
    timed = [r for r in records if r["timed"]]
    mean = lambda k: statistics.fmean(r[k] for r in timed) if timed else float("nan")  # noqa: E731
    step_times = [r["step_s"] for r in timed]
    last = records[-5:]
    return {
        "timed_steps": len(timed),
        "wall_s": sum(step_times),
        "step_s": mean("step_s"),
        "step_p50_s": percentile(step_times, 50),
        "step_p95_s": percentile(step_times, 95),
        "data_s": mean("data_s"),
        "compute_s": mean("compute_s"),
        "comm_s": mean("comm_s"),
        "first_loss": records[0]["loss"] if records else float("nan"),
        "last_loss": statistics.fmean(r["loss"] for r in last) if last else float("nan"),
        "peak_memory_bytes": int(peak_memory_bytes),
    }


def summarize(per_rank: Sequence[dict[str, Any]], global_batch: int) -> dict[str, Any]:
    """Run summary over all ranks. Throughput uses the slowest rank's timed wall time, because a
    synchronous data-parallel step ends for everyone when the slowest rank ends."""
    n = len(per_rank)
    steps = per_rank[0]["timed_steps"]
    wall = max(r["wall_s"] for r in per_rank)
    avg = lambda k: statistics.fmean(r[k] for r in per_rank)  # noqa: E731
    step = avg("step_s")
    throughput = global_batch * steps / wall if wall > 0 else float("nan")
    return {
        "world_size": n,
        "global_batch": global_batch,
        "timed_steps": steps,
        "throughput_samples_per_s": throughput,
        "throughput_per_rank": throughput / n,
        "step_ms": 1e3 * step,
        "step_p50_ms": 1e3 * avg("step_p50_s"),
        "step_p95_ms": 1e3 * max(r["step_p95_s"] for r in per_rank),
        "compute_ms": 1e3 * avg("compute_s"),
        "comm_ms": 1e3 * avg("comm_s"),
        "data_ms": 1e3 * avg("data_s"),
        "compute_share": avg("compute_s") / step if step > 0 else float("nan"),
        "comm_share": avg("comm_s") / step if step > 0 else float("nan"),
        "data_share": avg("data_s") / step if step > 0 else float("nan"),
        "first_loss": avg("first_loss"),
        "last_loss": avg("last_loss"),
        "peak_memory_bytes": [r["peak_memory_bytes"] for r in per_rank],
        "per_rank": list(per_rank),
    }
