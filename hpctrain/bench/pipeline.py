"""`hpctrain bench pipeline`: the measured pipeline bubble against the theory (p - 1)/(m + p - 1)
at m = 1, 2, 4, 8 micro-batches, for GPipe and 1F1B, on real pipeline runs of a balanced MLP.
Each run's bubble is the mean over ranks of the time a stage waited for its neighbours, as a
share of the step; the runs go one after the other in one invocation."""

from __future__ import annotations

import argparse
import subprocess
from datetime import datetime
from pathlib import Path

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from hpctrain import records
from hpctrain.analysis.metrics import pipeline_bubble
from hpctrain.bench import hpctrain_run
from hpctrain.errors import LaunchError
from hpctrain.lifeline import with_lifeline

MICROBATCHES = (1, 2, 4, 8)


def _argv(run_dir: Path, stages: int, schedule: str, m: int, batch: int, steps: int) -> list[str]:
    return hpctrain_run(
        run_dir,
        # 6 blocks of 512 on 256 inputs: two stages of three blocks each (the head is small)
        "model=mlp",
        "model.depth=6",
        "model.width=512",
        "data=synthetic",
        "data.channels=1",
        "data.image_size=16",
        f"data.num_samples={batch * 4}",
        "parallelism=pipeline",
        f"parallelism.stages={stages}",
        f"cluster.ranks={stages}",
        f"parallelism.schedule={schedule}",
        f"parallelism.microbatches={m}",
        f"train.batch_per_rank={batch}",
        f"train.steps={steps}",
        f"train.warmup_steps={max(1, steps // 5)}",
        "train.save_model=false",
        "train.log_interval=1000",
    )


def run_pipeline_bench(args: argparse.Namespace, console: Console) -> int:
    out = Path(args.out) / datetime.now().strftime("%Y-%m-%d/%H-%M-%S-pipeline")
    cases = [(s, m) for s in ("gpipe", "1f1b") for m in MICROBATCHES if s == "gpipe" or m >= args.stages]
    rows = []
    with Progress(console=console, transient=True) as bar:
        task = bar.add_task("pipeline runs", total=len(cases))
        for schedule, m in cases:
            run_dir = out / f"{schedule}-m{m}"
            argv = _argv(run_dir, args.stages, schedule, m, args.batch, args.steps)
            r = subprocess.run(
                with_lifeline(argv), capture_output=True, text=True, timeout=1800
            )  # ends with us
            if r.returncode != 0:
                raise LaunchError(
                    f"benchmark run failed ({r.returncode}): {' '.join(argv)}\n{r.stderr[-2000:]}"
                )
            s = records.read(run_dir / records.SUMMARY, records.RunSummary)
            rows.append((schedule, m, s))
            bar.advance(task)
    table = Table(
        title=f"pipeline bubble: mlp 6x512, {args.stages} stages, batch {args.batch}, {args.steps} steps"
    )
    for col in (
        "schedule",
        "micro-batches",
        "bubble (measured)",
        "(p-1)/(m+p-1)",
        "measured / theory",
        "step ms",
        "samples/s",
    ):
        table.add_column(col, justify="right")
    for schedule, m, s in rows:
        theory = pipeline_bubble(args.stages, m)
        table.add_row(
            schedule,
            str(m),
            f"{100 * s.bubble_share:.1f}%",
            f"{100 * theory:.1f}%",
            f"{s.bubble_share / theory:.2f}",
            f"{1e3 * s.step_s:.1f}",
            f"{s.throughput_samples_per_s:.0f}",
        )
    console.print(table)
    console.print(f"runs in {out}")
    return 0
