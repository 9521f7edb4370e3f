"""`hpctrain bench profile`: what profile.enabled costs outside its window. The same training runs
with the profiler off and with a window that ends before the timed steps begin (profile.steps
within the warm-up), interleaved in a rotated order; the ratio of median timed throughputs, taken
in this one run, is the profiler's cost outside its window (1.00: none)."""

from __future__ import annotations

import argparse
import statistics
from datetime import datetime
from pathlib import Path

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from hpctrain import records
from hpctrain.bench import run_checked
from hpctrain.bench.overhead import Setup, hpctrain_argv

CONTENDERS = ("profiler off", "window ended")


def _argv(run_dir: Path, which: str, ranks: int, steps: int, warmup: int) -> list[str]:
    """The overhead benchmark's hpctrain run (cnn, synthetic data, 32 per rank), with a window."""
    window = (
        ["profile.enabled=true", f"profile.steps=[1,{max(warmup - 2, 1)}]"] if which != "profiler off" else []
    )
    work = Setup(ranks, threads=0, batch=32, steps=steps, warmup=warmup)  # threads: hpctrain's own choice
    return [*hpctrain_argv("horovod", run_dir, work), *window]


def run_profile_bench(args: argparse.Namespace, console: Console) -> int:
    out = Path(args.out).resolve() / datetime.now().strftime("profile-%Y%m%d-%H%M%S")
    found: dict[str, list[float]] = {c: [] for c in CONTENDERS}
    with Progress(console=console, transient=True) as bar:
        task = bar.add_task("profiler bench", total=args.repeats * len(CONTENDERS))
        for rep in range(args.repeats):
            order = CONTENDERS[rep % 2 :] + CONTENDERS[: rep % 2]  # rotated: drift hits both alike
            for which in order:
                run_dir = out / f"{which.replace(' ', '-')}-{rep}"
                argv = _argv(run_dir, which, args.ranks, args.steps, args.warmup)
                run_checked(argv)
                s = records.read(run_dir / records.SUMMARY, records.RunSummary)
                found[which].append(s.throughput_samples_per_s)
                bar.advance(task)
    med = {c: statistics.median(v) for c, v in found.items()}
    t = Table(title=f"profiler outside its window: {args.ranks} ranks, {args.repeats} interleaved runs each")
    for col in ("", "median samples/s", "runs", "vs off"):
        t.add_column(col, justify="right")
    for c in CONTENDERS:
        t.add_row(
            c, f"{med[c]:.1f}", " ".join(f"{v:.0f}" for v in found[c]), f"{med[c] / med['profiler off']:.3f}"
        )
    console.print(t)
    console.print(
        f"window ended / off = {med['window ended'] / med['profiler off']:.3f} (1.000: the profiler costs "
        "nothing once its window is over); records: " + str(out),
        highlight=False,
    )
    return 0
