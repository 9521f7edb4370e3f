"""`hpctrain run|study ... --estimate`: every point's predicted step, throughput, wall time and
cost with intervals, and the whole submission's; nothing is submitted."""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

from hpctrain.analysis.estimate import Band, PointEstimate, total
from hpctrain.analysis.memory import MEMORY_BAND, PARTS, gib, needed
from hpctrain.errors import ConfigError, Problem
from hpctrain.launch.base import Launcher
from hpctrain.orchestrate.estimate import MemoryRow, Point, estimate, memory_of


def _wall(b: Band) -> str:
    """Seconds, minutes or hours, whichever reads best, with the band."""
    for unit, k in (("h", 3600.0), ("min", 60.0)):
        if b.value >= 2 * k:
            return f"{b.text('.1f', 1 / k)} {unit}"
    return f"{b.text('.1f')} s"


def estimate_table(points: Sequence[PointEstimate], title: str) -> Table:
    t = Table(title=title, caption="ranges: the band each estimate carries (analysis/estimate.py)")
    for col in ("point", "ranks", "nodes", "step ms", "samples/s", "wall", "node-h", "core-h", "from"):
        t.add_column(col, justify="left" if col in ("point", "from") else "right")
    for p in points:
        g = p.target
        t.add_row(
            g.label,
            str(g.n),
            str(g.nodes),
            p.step_s.text(".2f", 1e3),
            p.throughput.text(".0f"),
            _wall(p.wall_s),
            p.node_hours.text(".3g"),
            p.core_hours.text(".3g"),
            p.how,
        )
    return t


def memory_table(rows: Sequence[MemoryRow]) -> Table:
    """Each point's predicted peak per rank (its worst rank), its parts, and what a rank has."""
    t = Table(
        title="memory per rank (predicted: the worst rank of each point)",
        caption="traced with fake tensors (memory/trace.py); fixed: the process's own, measured once on this "
        f"host; fits: the peak plus the prediction's {MEMORY_BAND:.0%} error band within what a rank has",
    )
    cols = ("point", "rank", *(p for p in PARTS), "peak", "has", "fits")
    for col in cols:
        t.add_column(col, justify="left" if col in ("point", "has") else "right")
    for r in rows:
        has = f"{gib(r.limit.bytes)} ({r.limit.source})" if r.limit else "not known"
        if r.prediction is None:
            t.add_row(r.label, "", *[""] * len(PARTS), "-", has, r.why_not)
            continue
        w = r.prediction.worst
        fits = "?" if r.limit is None else ("yes" if needed(w) <= r.limit.bytes else "[red]no[/]")
        t.add_row(r.label, str(w.rank), *(gib(v) for v in w.parts().values()), gib(w.peak), has, fits)
    return t


def show_estimate(console: Console, points: Sequence[PointEstimate], title: str) -> None:
    console.print(estimate_table(points, title))
    wall, nodes, cores = total(points)
    console.print(
        f"total: {len(points)} run(s), {_wall(wall)} one after another, {nodes.text('.3g')} node-hours, "
        f"{cores.text('.3g')} core-hours",
        highlight=False,
        soft_wrap=True,
    )
    for p in points:
        if p.over_limit:
            console.print(
                f"[yellow]warning:[/] {p.target.label} {p.over_limit}", highlight=False, soft_wrap=True
            )
    if any(not math.isfinite(p.wall_s.band) for p in points):
        console.print("some points have no band: the evidence could not say how far off they may be")
    console.print("nothing was submitted", highlight=False)


def cmd_estimate(
    args: argparse.Namespace, console: Console, launcher: Launcher, points: Sequence[Point], title: str
) -> int:
    if not args.estimate:  # --from alone
        raise ConfigError([Problem("--from", "names the evidence of an estimate", "add --estimate")])

    def say(text: str) -> None:
        console.print(f"[dim]{text}[/]", highlight=False)

    console.print(memory_table(memory_of(launcher, points, say)))
    if any(p.cfg.train.compile for p in points):
        console.print(
            "train.compile: the memory and the step time are predicted for the eager step (compiled kernels "
            "fuse and may hold less); the compile itself is in the warm-up steps, which the estimate leaves out",
            highlight=False,
            soft_wrap=True,
        )
    found = estimate(launcher, points, args.estimate_from.resolve() if args.estimate_from else None, say)
    show_estimate(console, found.points, title)
    for why in found.refused:
        console.print(f"[yellow]no estimate:[/] {why}", highlight=False, soft_wrap=True)
    return 1 if found.refused else 0
