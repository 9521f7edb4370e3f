"""`hpctrain bench estimate`: how close `--estimate` comes. A strong-scaling study is estimated
before it runs (locally from probes; on SLURM from a probe study of the same length, as a user would
name an earlier one with --from), then run; every run's predicted wall time and node-hours are set beside
what it took, with the error and whether the truth fell inside the estimate's band."""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from datetime import datetime
from pathlib import Path

from rich.console import Console
from rich.table import Table

from hpctrain import records
from hpctrain.analysis.estimate import PointEstimate
from hpctrain.analysis.evidence import whole_s
from hpctrain.bench import run_checked
from hpctrain.orchestrate.estimate import estimate, probe_length, study_points

TARGET = 0.25  # the bound on the error of the wall time and the node-hours


def _study(
    args: argparse.Namespace, scales: list[int], steps: int, reps: int, run_dir: Path, warmup: int = 5
) -> list[str]:
    scale = "nodes" if args.cluster == "slurm" else "ranks"
    # one job at a time, its MPI waiting without spinning: the one-machine test cluster's nodes
    # share its cores, and an estimate is for a job that has its nodes to itself
    alone = ["cluster.array_parallelism=1", "+cluster.env.OMPI_MCA_mpi_yield_when_idle=1"]
    alone = alone if args.cluster == "slurm" else []
    return [
        f"cluster={args.cluster}",
        *alone,
        f"study.{scale}=[{','.join(str(n) for n in scales)}]",
        f"study.repetitions={reps}",
        f"study.steps={steps}",
        f"study.warmup_steps={warmup}",
        f"study.global_batch={args.batch}",
        "study.allreduce_bench=false",
        "data=digits",
        "train.save_model=false",
        "train.log_interval=1000",
        f"run.dir={run_dir}",
    ]


def _run_study(overrides: list[str]) -> None:
    argv = [sys.executable, "-m", "hpctrain.cli", "study", "strong", "--no-progress", *overrides]
    run_checked(argv, "benchmark study", 3600)


def _err(predicted: float, actual: float) -> float:
    return predicted / actual - 1 if actual > 0 else math.nan


def _row(p: PointEstimate, run_dir: Path) -> tuple[list[str], float, float]:
    s = records.read(run_dir / records.SUMMARY, records.RunSummary)
    wall = whole_s(run_dir, s)
    nodes_h = max(s.nodes, 1) * wall / 3600
    e_wall, e_nodes = _err(p.wall_s.value, wall), _err(p.node_hours.value, nodes_h)
    inside = "yes" if p.wall_s.lo <= wall <= p.wall_s.hi else "no"
    cells = [
        p.target.label,
        str(p.target.n),
        p.wall_s.text(".2f"),
        f"{wall:.2f}",
        f"{100 * e_wall:+.1f}%",
        inside,
        f"{p.node_hours.value:.3g}",
        f"{nodes_h:.3g}",
        f"{100 * e_nodes:+.1f}%",
    ]
    return cells, e_wall, e_nodes


def _estimate_and_run(
    args: argparse.Namespace, console: Console, scales: list[int], out: Path
) -> tuple[list[tuple[PointEstimate, Path]], list[str]]:
    """One study at `scales`, estimated before it runs; each estimate and its run directory."""
    overrides = _study(args, scales, args.steps, args.reps, out / "study")
    launcher, points = study_points("strong", overrides, None)
    source = None
    if args.cluster == "slurm":  # a probe study first, named as the evidence, as long as a probe
        warm, timed = probe_length(args.steps, 5)
        console.print(
            f"probe study: {warm + timed} steps at {scales} -> {out / 'probe'}-strong", highlight=False
        )
        _run_study(_study(args, scales, warm + timed, 1, out / "probe", warm))
        source = out / "probe-strong"
    found = estimate(launcher, points, source, lambda text: console.print(f"[dim]{text}[/]"))
    console.print(
        f"the study: {len(points)} runs of {args.steps} steps -> {out / 'study'}-strong", highlight=False
    )
    _run_study(overrides)
    where = {p.label: Path(p.plan.run_dir) for p in points}
    return [(p, where[p.target.label]) for p in found.points], found.refused


def run_estimate_bench(args: argparse.Namespace, console: Console) -> int:
    out = Path(args.out).resolve() / datetime.now().strftime("%Y-%m-%d_%H-%M-%S-estimate")
    # on SLURM a study runs one job array per scale at once; the test cluster's nodes share this
    # machine's cores, so each scale gets its own study, one after the other
    groups = [[n] for n in args.scales] if args.cluster == "slurm" else [list(args.scales)]
    done: list[tuple[PointEstimate, Path]] = []
    refused: list[str] = []
    for scales in groups:
        rows, missing = _estimate_and_run(args, console, scales, out / f"n{'-'.join(map(str, scales))}")
        done += rows
        refused += missing
    table = Table(title=f"bench estimate: {args.cluster} strong study, predicted before it ran vs measured")
    for col in ("run", "N", "wall s (band)", "took s", "error", "in band", "node-h", "took", "error"):
        table.add_column(col, justify="left" if col == "run" else "right")
    errors = []
    for p, run_dir in done:
        cells, e_wall, e_nodes = _row(p, run_dir)
        table.add_row(*cells)
        errors += [abs(e_wall), abs(e_nodes)]
    console.print(table)
    worst = max(errors) if errors else math.nan
    console.print(
        f"mean |error| {100 * statistics.fmean(errors):.1f}%, worst {100 * worst:.1f}% "
        f"(target ≤ {100 * TARGET:.0f}%: {'met' if worst <= TARGET else 'NOT met'})",
        highlight=False,
    )
    for why in refused:
        console.print(f"[yellow]no estimate:[/] {why}", highlight=False)
    return 0
