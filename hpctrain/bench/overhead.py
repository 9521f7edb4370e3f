"""`hpctrain bench overhead`: training launched by hpctrain, with each engine, against minimal
hand-written Horovod and DDP scripts and against the no-communication ceiling (the same per-rank
work in independent processes started together), all with the same model, batch, ranks, threads
and timing. The contenders run interleaved, each repeat in a rotated order, so that machine noise
and drift hit all alike; ratios are of medians taken in this one run."""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from datetime import datetime
from pathlib import Path

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from hpctrain import records
from hpctrain.bench import hpctrain_run
from hpctrain.bench.minimal import throughput
from hpctrain.errors import ConfigError, LaunchError
from hpctrain.facts import free_tcp_port
from hpctrain.launch.local.plan import mpirun_prefix
from hpctrain.lifeline import with_lifeline

TARGET_OWN = 0.97  # each hpctrain engine against its own hand-written script
TARGET_CEILING = 0.95  # hpctrain's faster engine against the no-communication ceiling
CONTENDERS = ("ceiling", "minimal horovod", "minimal ddp", "hpctrain horovod", "hpctrain ddp")


def _minimal_argv(engine: str, ranks: int, threads: int, batch: int, steps: int, warmup: int) -> list[str]:
    argv, _ = mpirun_prefix(ranks, len(os.sched_getaffinity(0)), os.geteuid() == 0)
    argv += [
        "-x",
        f"OMP_NUM_THREADS={threads}",
        "-x",
        "MASTER_ADDR=127.0.0.1",
        "-x",
        f"MASTER_PORT={free_tcp_port()}",
        sys.executable,
        "-m",
        "hpctrain.bench.minimal",
        "--engine",
        engine,
        "--batch",
        str(batch),
        "--steps",
        str(steps),
        "--warmup",
        str(warmup),
    ]
    return argv


def _hpctrain_argv(engine: str, run_dir: Path, ranks: int, batch: int, steps: int, warmup: int) -> list[str]:
    return hpctrain_run(
        run_dir,
        "model=cnn",
        "data=synthetic",
        "data.num_samples=4096",
        f"cluster.ranks={ranks}",
        f"train.batch_per_rank={batch}",
        f"train.steps={steps}",
        f"train.warmup_steps={warmup}",
        "train.save_model=false",
        "train.log_interval=1000",
        f"parallelism.engine={engine}",
    )


def _run(argv: list[str]) -> str:
    r = subprocess.run(with_lifeline(argv), capture_output=True, text=True, timeout=1800)  # ends with us
    if r.returncode != 0:
        raise LaunchError(f"benchmark run failed ({r.returncode}): {' '.join(argv)}\n{r.stderr[-2000:]}")
    return r.stdout


def _measure(
    who: str, i: int, out: Path, ranks: int, threads: int, batch: int, steps: int, warmup: int
) -> float:
    kind, engine = who.split(" ") if " " in who else ("minimal", "none")
    if kind == "hpctrain":
        run_dir = out / f"hpctrain-{engine}-{i}"
        _run(_hpctrain_argv(engine, run_dir, ranks, batch, steps, warmup))
        return float(records.read(run_dir / records.SUMMARY, records.RunSummary).throughput_samples_per_s)
    return throughput(_run(_minimal_argv(engine, ranks, threads, batch, steps, warmup)), batch, steps, warmup)


def run_overhead(args: argparse.Namespace, console: Console) -> int:
    if args.steps < 2:  # one warm-up step and at least one timed step
        raise ConfigError.one("--steps", f"must be at least 2 (got {args.steps})", "e.g. --steps 60")
    cores = len(os.sched_getaffinity(0))
    threads = max(1, cores // args.ranks)
    warmup = max(1, args.steps // 10)
    out = Path(args.out) / datetime.now().strftime("%Y-%m-%d/%H-%M-%S-overhead")
    got: dict[str, list[float]] = {c: [] for c in CONTENDERS}
    with Progress(console=console, transient=True) as bar:
        task = bar.add_task("interleaved runs", total=len(CONTENDERS) * args.repeats)
        for i in range(args.repeats):
            # rotated order: no contender always runs first (caches, clocks and neighbours drift)
            k = i % len(CONTENDERS)
            for who in CONTENDERS[k:] + CONTENDERS[:k]:
                got[who].append(_measure(who, i, out, args.ranks, threads, args.batch, args.steps, warmup))
                bar.advance(task)
    med = {c: statistics.median(v) for c, v in got.items()}
    table = Table(
        title=f"overhead: cnn, synthetic 3x32x32, {args.ranks} ranks x batch {args.batch}, "
        f"{args.steps} steps ({warmup} warm-up), {threads} thread(s)/rank, {args.repeats} repeats"
    )
    for col in ("contender", "samples/s (median)", "runs", "/ ceiling", "/ own minimal"):
        table.add_column(col, justify="right")
    for c in CONTENDERS:
        own = f"{med[c] / med['minimal ' + c.split()[1]]:.3f}" if c.startswith("hpctrain") else ""
        runs = " ".join(f"{v:.0f}" for v in got[c])
        table.add_row(c, f"{med[c]:.1f}", runs, f"{med[c] / med['ceiling']:.3f}", own)
    console.print(table)
    best = max(med["hpctrain horovod"], med["hpctrain ddp"]) / med["ceiling"]
    for label, ratio, target in (
        ("hpctrain's faster engine / ceiling", best, TARGET_CEILING),
        ("hpctrain horovod / minimal horovod", med["hpctrain horovod"] / med["minimal horovod"], TARGET_OWN),
        ("hpctrain ddp / minimal ddp", med["hpctrain ddp"] / med["minimal ddp"], TARGET_OWN),
    ):
        verdict = "[green]meets[/]" if ratio >= target else "[red]below[/]"
        console.print(f"{label} = {ratio:.3f} ({verdict} the {target} target)")
    console.print(f"runs in {out}")
    return 0
