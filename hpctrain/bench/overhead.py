"""`hpctrain bench overhead`: throughput of training launched by hpctrain against a minimal
hand-written Horovod script (same model, batch, ranks, synthetic data, thread count, timing),
the two run interleaved in ABBA order so that machine noise and drift hit both alike."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from datetime import datetime
from pathlib import Path

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from .. import records
from ..errors import ConfigError, LaunchError
from ..plan import mpirun_prefix

TARGET = 0.97


def _minimal_argv(ranks: int, threads: int, batch: int, steps: int, warmup: int) -> list[str]:
    argv, _ = mpirun_prefix(ranks, len(os.sched_getaffinity(0)), os.geteuid() == 0)
    argv += [
        "-x",
        f"OMP_NUM_THREADS={threads}",
        sys.executable,
        "-m",
        "hpctrain.bench.minimal_horovod",
        "--batch",
        str(batch),
        "--steps",
        str(steps),
        "--warmup",
        str(warmup),
    ]
    return argv


def _hpctrain_argv(run_dir: Path, ranks: int, batch: int, steps: int, warmup: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "hpctrain.cli",
        "run",
        "--no-progress",
        f"run.dir={run_dir}",
        "model=cnn",
        "data=synthetic",
        "data.num_samples=4096",
        f"cluster.ranks={ranks}",
        f"train.batch_per_rank={batch}",
        f"train.steps={steps}",
        f"train.warmup_steps={warmup}",
        "train.save_model=false",
        "train.log_interval=1000",
    ]


def _run(argv: list[str]) -> str:
    r = subprocess.run(argv, capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        raise LaunchError(f"benchmark run failed ({r.returncode}): {' '.join(argv)}\n{r.stderr[-2000:]}")
    return r.stdout


def run_overhead(args: argparse.Namespace, console: Console) -> int:
    if args.steps < 2:  # one warm-up step and at least one timed step
        raise ConfigError.one("--steps", f"must be at least 2 (got {args.steps})", "e.g. --steps 60")
    cores = len(os.sched_getaffinity(0))
    threads = max(1, cores // args.ranks)
    warmup = max(1, args.steps // 10)
    out = Path(args.out) / datetime.now().strftime("%Y-%m-%d/%H-%M-%S-overhead")
    ours: list[float] = []
    base: list[float] = []
    with Progress(console=console, transient=True) as bar:
        task = bar.add_task("interleaved runs", total=2 * args.repeats)
        for i in range(args.repeats):
            # ABBA order: neither side always runs first (caches, clocks and neighbours drift).
            order = ("ours", "base") if i % 2 == 0 else ("base", "ours")
            for side in order:
                if side == "ours":
                    run_dir = out / f"hpctrain-{i}"
                    _run(_hpctrain_argv(run_dir, args.ranks, args.batch, args.steps, warmup))
                    ours.append(
                        records.read(run_dir / records.SUMMARY, records.RunSummary).throughput_samples_per_s
                    )
                else:
                    line = [
                        ln
                        for ln in _run(
                            _minimal_argv(args.ranks, threads, args.batch, args.steps, warmup)
                        ).splitlines()
                        if ln.startswith("{")
                    ][-1]
                    base.append(json.loads(line)["throughput_samples_per_s"])
                bar.advance(task)
    ratios = [a / b for a, b in zip(ours, base)]
    ratio = statistics.median(ours) / statistics.median(base)
    table = Table(
        title=f"overhead: cnn, synthetic 3x32x32, {args.ranks} ranks x batch {args.batch}, "
        f"{args.steps} steps ({warmup} warm-up), {threads} thread(s)/rank"
    )
    for col in ("run", "hpctrain samples/s", "minimal Horovod samples/s", "ratio"):
        table.add_column(col, justify="right")
    for i, (a, b, r) in enumerate(zip(ours, base, ratios)):
        table.add_row(str(i + 1), f"{a:.1f}", f"{b:.1f}", f"{r:.3f}")
    table.add_row(
        "median", f"{statistics.median(ours):.1f}", f"{statistics.median(base):.1f}", f"{ratio:.3f}"
    )
    console.print(table)
    verdict = "[green]meets[/]" if ratio >= TARGET else "[red]below[/]"
    console.print(
        f"throughput ratio hpctrain / minimal Horovod = {ratio:.3f} ({verdict} the {TARGET} target); "
        f"runs in {out}"
    )
    return 0
