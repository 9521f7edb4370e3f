"""Per-rank timing statistics and the run summary rank 0 writes. Pure functions."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from hpctrain.analysis.peak import achieved_tflops, mfu
from hpctrain.records import FORMAT_VERSION, LAST_LOSS_STEPS, RankSummary, RunSummary, StepRecord
from hpctrain.records.parts import measured_parts, rank_parts, share


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default method), q in [0, 100]."""
    if not values:
        return float("nan")
    s = sorted(values)
    pos = (len(s) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def straggler_waits(busy_by_rank: Sequence[Mapping[int, float]]) -> list[float]:
    """Each rank's mean wait for the slowest rank, step by step: max over ranks of the busy time
    (data + compute before the step's collective) minus its own, over the steps every rank timed.
    Their mean is max - mean, the time load imbalance costs (POP's load-balance efficiency is
    mean / max: Wagner et al. 2017, "A structured approach to performance analysis")."""
    common = set.intersection(*(set(b) for b in busy_by_rank)) if busy_by_rank else set()
    if not common:
        return [float("nan")] * len(busy_by_rank)
    top = {k: max(b[k] for b in busy_by_rank) for k in common}
    return [statistics.fmean(top[k] - b[k] for k in common) for b in busy_by_rank]


def rank_stats(
    steps: Sequence[StepRecord],
    rank: int,
    host: str,
    peak_memory_bytes: int,
    parameters: int,
    threads: int = 0,
    grad_tensors: int = 0,
    probe: tuple[float, float] = (0.0, 0.0),
    wait_s: float = float("nan"),
    held: dict[str, int] | None = None,
    figures: Mapping[str, Mapping[str, Any]] | None = None,
    accuracy: float | None = None,
    topology: str = "",
    compile_s: float = 0.0,
) -> RankSummary:
    """One rank's aggregate over its timed steps (warm-up steps excluded); `figures`: what its
    trainer measured once, by part key (Trainer.figures)."""
    timed = [r for r in steps if r.timed]

    def mean(k: str) -> float:
        return statistics.fmean(getattr(r, k) for r in timed) if timed else float("nan")

    step_times = [r.step_s for r in timed]
    last = steps[-LAST_LOSS_STEPS:]
    return RankSummary(
        rank=rank,
        host=host,
        topology=topology,
        timed_steps=len(timed),
        wall_s=sum(step_times),
        step_s=mean("step_s"),
        step_p50_s=percentile(step_times, 50),
        step_p95_s=percentile(step_times, 95),
        data_s=mean("data_s"),
        compute_s=mean("compute_s"),
        comm_s=mean("comm_s"),
        heldout_accuracy=accuracy,
        first_loss=steps[0].loss if steps else float("nan"),
        last_loss=statistics.fmean(r.loss for r in last) if last else float("nan"),
        peak_memory_bytes=int(peak_memory_bytes),
        parameters=parameters,
        parts=rank_parts(timed, figures or {}),
        threads=threads,
        compile_s=compile_s,
        grad_tensors=grad_tensors,
        probe_small_s=probe[0],
        probe_full_s=probe[1],
        **(held or {}),
        wait_s=wait_s,
    )


def finite(x: float) -> float | None:
    """A figure for the records, None where it is unknown (JSON has no NaN)."""
    return x if math.isfinite(x) else None


def summarize(per_rank: Sequence[RankSummary], global_batch: int, **about: Any) -> RunSummary:
    """Run summary over all ranks. Throughput uses the slowest rank's timed wall time, because a
    synchronous data-parallel step ends for everyone when the slowest rank ends. `about`: the
    descriptive fields (model, precision, backend, compression, started, finished)."""
    n = len(per_rank)
    steps = per_rank[0].timed_steps
    wall = max(r.wall_s for r in per_rank)

    def avg(k: str) -> float:
        return statistics.fmean(getattr(r, k) for r in per_rank)

    step = avg("step_s")
    throughput = global_batch * steps / wall if wall > 0 else float("nan")
    hosts = sorted({r.host for r in per_rank})
    nodes = len(hosts)
    switches = sorted({r.topology.rpartition(".")[0] for r in per_rank} - {""})
    if "flops_per_sample" in about:  # MFU (analysis/peak.py), from the slowest rank's throughput
        flops, peak = about["flops_per_sample"], about["peak_tflops"]
        about.update(
            flops_per_sample=finite(flops),
            peak_tflops=finite(peak),
            tflops_per_rank=finite(achieved_tflops(flops, throughput, n)),
            mfu=finite(mfu(flops, throughput, n, peak)),
        )
    start, end = about.get("started"), about.get("finished")
    hours = (end - start) / 3600 if isinstance(start, float) and isinstance(end, float) else float("nan")
    return RunSummary(
        nodes=nodes,
        hosts=hosts,
        switches=switches,
        node_hours=nodes * hours,
        core_hours=n * max(per_rank[0].threads, 1) * hours,
        cost_source="allocation",
        format_version=FORMAT_VERSION,
        world_size=n,
        global_batch=global_batch,
        batch_per_rank=global_batch // n,
        timed_steps=steps,
        throughput_samples_per_s=throughput,
        throughput_per_rank=throughput / n,
        step_s=step,
        step_p50_s=avg("step_p50_s"),
        step_p95_s=max(r.step_p95_s for r in per_rank),
        compute_s=avg("compute_s"),
        comm_s=avg("comm_s"),
        data_s=avg("data_s"),
        compute_share=share(avg("compute_s"), step),
        comm_share=share(avg("comm_s"), step),
        data_share=share(avg("data_s"), step),
        parts=measured_parts(about.pop("parts", {}), per_rank, step),
        first_loss=avg("first_loss"),
        last_loss=avg("last_loss"),
        peak_memory_bytes=[r.peak_memory_bytes for r in per_rank],
        parameters=per_rank[0].parameters,
        per_rank=list(per_rank),
        threads_per_rank=per_rank[0].threads,
        compile_s=max(r.compile_s for r in per_rank),
        grad_tensors=per_rank[0].grad_tensors,
        probe_small_s=avg("probe_small_s"),
        probe_full_s=avg("probe_full_s"),
        imbalance_s=avg("wait_s"),
        heldout_accuracy=per_rank[0].heldout_accuracy,
        **about,
    )
