"""`hpctrain bench analyze`: analyze + report a synthetic study of N runs (target: 1,000 runs in
under 2 s). Synthetic records follow Amdahl's law with noise, written once, then timed."""
from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from ..analysis.analyze import analyze_dir
from ..analysis.report import write_report

TARGET_S = 2.0


def synthetic_study(root: Path, runs: int, seed: int = 0) -> Path:
    rng = random.Random(seed)
    scales = [1, 2, 4, 8, 16, 32, 64, 128]
    entries = []
    for i in range(runs):
        n = scales[i % len(scales)]
        step = 0.1 * (0.05 + 0.95 / n) * rng.uniform(0.95, 1.05)  # Amdahl, s = 0.05, global batch 256
        d = root / f"n{n}-r{i}"
        d.mkdir(parents=True)
        (d / "summary.json").write_text(json.dumps({
            "world_size": n, "global_batch": 256, "throughput_samples_per_s": 256 / step, "step_ms": 1e3 * step,
            "compute_ms": 1e3 * step * 0.8, "comm_ms": 1e3 * step * 0.15, "data_ms": 1e3 * step * 0.05,
            "parameters": 1_000_000}))
        (d / "plan.json").write_text(json.dumps({"batch": {"per_rank": 256 / n}}))
        entries.append({"run_dir": str(d), "rep": i // len(scales)})
    (root / "study.json").write_text(json.dumps({"kind": "strong", "runs": entries}))
    return root


def run_bench(args: argparse.Namespace, console: Console) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        study = synthetic_study(Path(tmp), args.runs)
        t0 = time.perf_counter()
        a = analyze_dir(study)
        t1 = time.perf_counter()
        write_report(a, study / "report")
        t2 = time.perf_counter()
    table = Table(title=f"bench analyze: synthetic strong study of {args.runs} runs, 8 scales")
    table.add_column("phase")
    table.add_column("seconds", justify="right")
    table.add_row("collect + analyze", f"{t1 - t0:.3f}")
    table.add_row("report (CSV, 4 plots, Markdown, HTML)", f"{t2 - t1:.3f}")
    table.add_row("total", f"{t2 - t0:.3f}")
    console.print(table)
    verdict = "[green]meets[/]" if t2 - t0 < TARGET_S else "[red]misses[/]"
    console.print(f"{args.runs} runs analyzed and reported in {t2 - t0:.2f} s ({verdict} the {TARGET_S:.0f} s target); "
                  f"serial fraction fitted {a.amdahl_serial_fraction:.3f} (generated with 0.05)")
    return 0
