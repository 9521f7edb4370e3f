"""`hpctrain bench analyze`: analyze + report a synthetic study of N runs (target: 1,000 runs in
under 2 s). Synthetic records follow Amdahl's law with noise, written once, then timed."""

from __future__ import annotations

import argparse
import dataclasses
import random
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from .. import records
from ..analysis.analyze import analyze_dir
from ..analysis.report import write_report
from ..train.stats import summarize

TARGET_S = 2.0


def synthetic_summary(
    n: int,
    global_batch: int,
    step: float,
    compute: float,
    comm: float,
    data: float,
    parameters: int = 1_000_000,
    engine: str = "horovod",
) -> records.RunSummary:
    """A run summary with the given timings (every rank alike), as a real run would write it."""
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


def synthetic_study(root: Path, runs: int, seed: int = 0) -> Path:
    rng = random.Random(seed)
    scales = [1, 2, 4, 8, 16, 32, 64, 128]
    entries = []
    for i in range(runs):
        n = scales[i % len(scales)]
        step = 0.1 * (0.05 + 0.95 / n) * rng.uniform(0.95, 1.05)  # Amdahl, s = 0.05, global batch 256
        d = root / f"n{n}-r{i}"
        records.write(
            d / records.SUMMARY, synthetic_summary(n, 256, step, 0.8 * step, 0.15 * step, 0.05 * step)
        )
        entries.append(records.StudyRun(d.name, n, i // len(scales), n, [], str(d)))
    records.write(
        root / records.STUDY,
        records.new(records.StudyManifest, kind="strong", launcher="local", runs=entries),
    )
    return root


def run_bench(args: argparse.Namespace, console: Console) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        study = synthetic_study(Path(tmp), args.runs)
        t0 = time.perf_counter()
        a = analyze_dir(study)
        t1 = time.perf_counter()
        write_report(a, study / records.REPORT)
        t2 = time.perf_counter()
    table = Table(title=f"bench analyze: synthetic strong study of {args.runs} runs, 8 scales")
    table.add_column("phase")
    table.add_column("seconds", justify="right")
    table.add_row("collect + analyze", f"{t1 - t0:.3f}")
    table.add_row("report (CSV, 4 plots, Markdown, HTML)", f"{t2 - t1:.3f}")
    table.add_row("total", f"{t2 - t0:.3f}")
    console.print(table)
    verdict = "[green]meets[/]" if t2 - t0 < TARGET_S else "[red]misses[/]"
    console.print(
        f"{args.runs} runs analyzed and reported in {t2 - t0:.2f} s ({verdict} the {TARGET_S:.0f} s target); "
        f"serial fraction fitted {a.series[0].amdahl_serial_fraction:.3f} (generated with 0.05)"
    )
    return 0
