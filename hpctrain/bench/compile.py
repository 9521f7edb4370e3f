"""`hpctrain bench compile`: the built-in transformer eager and compiled (train.compile: each block
torch.compile'd), same model, data, ranks and steps, run interleaved in rotated order so that
machine noise hits both alike. It prints each side's steady-state step time (the median of its
runs' median timed step), the compiled side's compile seconds (recorded apart from the steps: it
happens in the warm-up), and the ratio of throughputs taken in this one run."""

from __future__ import annotations

import argparse
import statistics
from datetime import datetime
from pathlib import Path

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from hpctrain import records
from hpctrain.bench import hpctrain_run, run_checked

SIDES = {"eager": "train.compile=false", "compiled": "train.compile=true"}


def _argv(run_dir: Path, args: argparse.Namespace, side: str) -> list[str]:
    return hpctrain_run(
        run_dir,
        "model=transformer",
        f"model.width={args.width}",
        f"model.depth={args.depth}",
        f"model.heads={args.heads}",
        "data=tokens",
        f"data.seq_len={args.seq_len}",
        f"cluster.ranks={args.ranks}",
        f"train.device={args.device}",
        f"precision={args.precision}",
        f"train.batch_per_rank={args.batch}",
        f"train.steps={args.steps}",
        f"train.warmup_steps={max(2, args.steps // 5)}",  # the compile, and its first recompiles
        "train.save_model=false",
        "train.log_interval=100000",
        "parallelism.engine=ddp",
        SIDES[side],
    )


def run_compile_bench(args: argparse.Namespace, console: Console) -> int:
    out = Path(args.out) / datetime.now().strftime("%Y-%m-%d/%H-%M-%S-compile")
    got: dict[str, list[records.RunSummary]] = {s: [] for s in SIDES}
    sides = list(SIDES)
    with Progress(console=console, transient=True, disable=not console.is_terminal) as bar:
        task = bar.add_task("interleaved runs", total=args.repeats * len(sides))
        for i in range(args.repeats):
            for side in sides[i % 2 :] + sides[: i % 2]:  # rotated: neither always runs first
                run_dir = out / f"{side}-{i}"
                run_checked(_argv(run_dir, args, side), f"{side} run")
                got[side].append(records.read(run_dir / records.SUMMARY, records.RunSummary))
                bar.advance(task)
    step = {s: statistics.median(r.step_p50_s for r in got[s]) for s in sides}
    thr = {s: statistics.median(r.throughput_samples_per_s for r in got[s]) for s in sides}
    table = Table(
        title=f"compile: transformer width {args.width} x {args.depth} blocks, seq {args.seq_len}, {args.ranks} "
        f"rank(s) x batch {args.batch}, {args.precision} on {args.device}, {args.steps} steps, {args.repeats} repeats"
    )
    for col in ("side", "step (median, ms)", "samples/s", "compile s (median)", "/ eager"):
        table.add_column(col, justify="right")
    for s in sides:
        compile_s = statistics.median(r.compile_s for r in got[s])
        table.add_row(
            s,
            f"{1e3 * step[s]:.2f}",
            f"{thr[s]:.1f}",
            f"{compile_s:.1f}" if compile_s else "-",
            f"{thr[s] / thr['eager']:.3f}",
        )
    console.print(table)
    console.print(f"runs in {out}", highlight=False)
    return 0
