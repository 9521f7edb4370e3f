"""`hpctrain bench analyze`: analyze + report synthetic studies of several sizes (targets: 1,000
runs in 1 s, 10,000 in 4 s), each analysed twice (the first analysis reads every record and
writes the study's summary cache, the second reads the cache), with the power-law exponent of
the growth. Synthetic records follow Amdahl's law with noise, written once, then timed."""

from __future__ import annotations

import argparse
import dataclasses
import math
import random
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from hpctrain import records
from hpctrain.analysis.analyze import Analysis, analyze_dir
from hpctrain.analysis.model import CommModel
from hpctrain.analysis.report import write_report
from hpctrain.analysis.stepmodel import spread
from hpctrain.train.stats import summarize


def synthetic_summary(
    n: int,
    global_batch: int,
    step: float,
    compute: float,
    comm: float,
    data: float,
    parameters: int = 1_000_000,
    engine: str = "horovod",
    wait: float = 0.0,
) -> records.RunSummary:
    """A run summary with the given timings (every rank alike), as a real run would write it;
    `wait` of `comm` is the wait for the slowest rank."""
    rank = records.RankSummary(
        rank=0,
        host="host0",
        timed_steps=10,
        wall_s=10 * step,
        step_s=step,
        step_p50_s=step,
        step_p95_s=step,
        data_s=data,
        compute_s=compute,
        comm_s=comm,
        first_loss=2.3,
        last_loss=1.0,
        peak_memory_bytes=2**20,
        parameters=parameters,
        wait_s=wait if n > 1 else 0.0,
    )
    return summarize(
        [dataclasses.replace(rank, rank=r) for r in range(n)],
        global_batch,
        started=0.0,
        finished=1.0,
        model="cnn",
        precision="fp32",
        backend="mpi",
        compression="none",
        engine=engine,
    )


# The synthetic engine: L = 2 ms over a wire of alpha = 20 us, 1 GB/s; half the allreduce exposed.
SYNTHETIC_COMM = CommModel(alpha_s=20e-6, beta_s_per_byte=1e-9, latency_s=2e-3)
SYNTHETIC_EXPOSED = 0.5
SYNTHETIC_PARAMETERS = 1_000_000  # 4 MB of fp32 gradients
SYNTHETIC_JITTER = 0.02  # busy time per step varies 2% between ranks: the wait for the slowest


def synthetic_study(root: Path, runs: int, seed: int = 0) -> Path:
    """Compute follows Amdahl's law (s = 0.05, global batch 256), communication the synthetic
    engine, each with 5% noise, plus the wait for the slowest of n ranks with 2% jitter; an
    allreduce benchmark at each multi-rank scale."""
    rng = random.Random(seed)
    scales = [1, 2, 4, 8, 16, 32, 64, 128]
    grad = 4.0 * SYNTHETIC_PARAMETERS
    entries = []
    for i in range(runs):
        n = scales[i % len(scales)]
        compute = 0.1 * (0.05 + 0.95 / n) * rng.uniform(0.95, 1.05)
        comm = SYNTHETIC_EXPOSED * SYNTHETIC_COMM.allreduce_s(n, grad) * rng.uniform(0.95, 1.05)
        data = 0.002 * 8 / n
        wait = SYNTHETIC_JITTER * spread(n) * (compute + data)
        d = root / f"n{n}-r{i}"
        step = compute + comm + wait + data
        records.write(
            d / records.SUMMARY,
            synthetic_summary(n, 256, step, compute, comm + wait, data, SYNTHETIC_PARAMETERS, wait=wait),
        )
        entries.append(records.StudyRun(d.name, n, i // len(scales), n, [], str(d)))
    wire = CommModel(SYNTHETIC_COMM.alpha_s, SYNTHETIC_COMM.beta_s_per_byte)
    for n in sorted({scales[i % len(scales)] for i in range(runs)} - {1}):
        rows = [
            records.AllreduceRow(
                n,
                b,
                10,
                SYNTHETIC_COMM.allreduce_s(n, b) * rng.uniform(0.97, 1.03),
                wire.allreduce_s(n, b) * rng.uniform(0.97, 1.03),
            )
            for b in (2**k for k in range(10, 27, 2))
        ]
        records.write(
            root / f"allreduce-n{n}.json",
            records.new(records.AllreduceResult, n=n, mpi_library="synthetic", rows=rows),
        )
    records.write(
        root / records.STUDY,
        records.new(records.StudyManifest, kind="strong", launcher="local", runs=entries),
    )
    return root


# the targets (bench/args.py's help says them): re-analysis + report of 1,000 runs in 1 s, of 10,000 in 4 s
TARGETS_S = {1000: 1.0, 10000: 4.0}


@dataclass(frozen=True)
class Timing:
    runs: int
    cold_s: float  # the first analysis: every record read, the cache written
    warm_s: float  # the analysis again: the cache read, every record's identity checked
    report_s: float  # CSV, plots, Markdown, HTML
    again_s: float  # the report again, nothing changed: the plots kept (analysis/plots.py)


def time_study(runs: int) -> tuple[Timing, Analysis]:
    with tempfile.TemporaryDirectory() as tmp:
        study = synthetic_study(Path(tmp), runs)
        t0 = time.perf_counter()
        analyze_dir(study)
        t1 = time.perf_counter()
        a = analyze_dir(study)
        t2 = time.perf_counter()
        write_report(a, study / records.REPORT)
        t3 = time.perf_counter()
        write_report(analyze_dir(study), study / records.REPORT)
        t4 = time.perf_counter()
    return Timing(runs, t1 - t0, t2 - t1, t3 - t2, t4 - t3), a


def growth(sizes: list[int], seconds: list[float]) -> float:
    """The exponent k of t = c * n**k, least squares in log-log (1: linear)."""
    xs, ys = [math.log(n) for n in sizes], [math.log(max(t, 1e-9)) for t in seconds]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var if var else float("nan")


def run_bench(args: argparse.Namespace, console: Console) -> int:
    sizes = sorted(set(args.runs))
    timings, last = [], None
    for n in sizes:
        t, last = time_study(n)
        timings.append(t)
    table = Table(title="bench analyze: synthetic strong studies, 8 scales (seconds)")
    cols = ("runs", "first analysis", "re-analysis", "report", "re-analysis + report", "target", "both again")
    for col in cols:
        table.add_column(col, justify="right")
    ok = True
    for t in timings:
        total = t.warm_s + t.report_s
        target = TARGETS_S.get(t.runs)
        ok = ok and (target is None or total <= target)
        mark = "" if target is None else f"{target:g} ({'met' if total <= target else 'missed'})"
        table.add_row(
            str(t.runs), f"{t.cold_s:.3f}", f"{t.warm_s:.3f}", f"{t.report_s:.3f}", f"{total:.3f}", mark,
            f"{t.again_s:.3f}",
        )  # fmt: skip
    console.print(table)
    if len(sizes) > 1:
        console.print(
            f"growth from {sizes[0]} to {sizes[-1]} runs, t ~ n^k: first analysis k = "
            f"{growth(sizes, [t.cold_s for t in timings]):.2f}, re-analysis k = "
            f"{growth(sizes, [t.warm_s for t in timings]):.2f}, report k = "
            f"{growth(sizes, [t.report_s for t in timings]):.2f}",
            highlight=False,
        )
    m = last.series[0].step_model if last else None
    if m:
        console.print(
            f"fitted engine latency {1e3 * m.comm.latency_s:.2f} ms and exposed share {m.exposed:.2f} "
            f"(generated with {1e3 * SYNTHETIC_COMM.latency_s:.0f} ms and {SYNTHETIC_EXPOSED}), largest "
            f"leave-one-out error {100 * m.loo_band:.1f}%",
            highlight=False,
        )
    return 0 if ok else 1
