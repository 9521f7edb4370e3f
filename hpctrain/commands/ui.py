"""Terminal presentation: the console, the progress bar fed by rank-0 events, and tables."""

from __future__ import annotations

import math
import os
import sys
import textwrap
from typing import Any, TextIO

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from hpctrain.analysis.part_rows import rows_of
from hpctrain.analysis.roofline import for_run
from hpctrain.records import LAST_LOSS_STEPS, RunSummary
from hpctrain.records.parts import shard_degree

NOT_A_TERMINAL_WIDTH = 100_000  # pipes, SLURM log files, CI: never cut a table or wrap a line
PROSE_WIDTH = 100  # advice below a table is wrapped here, on a terminal and in a log file alike


def make_console(stream: TextIO | None = None) -> Console:
    """A console for stdout (or `stream`). Not on a terminal, nothing is wrapped or cut: a
    table is as wide as its content and a log line stays one line."""
    stream = stream or sys.stdout
    if stream.isatty() or os.environ.get("COLUMNS"):
        return Console(file=stream)
    return Console(file=stream, width=NOT_A_TERMINAL_WIDTH, soft_wrap=True)


class TrainingProgress:
    """A progress bar over training steps, updated from `progress` events."""

    def __init__(self, console: Console, total: int, enabled: bool = True) -> None:
        self.progress = Progress(
            TextColumn("[bold]training"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]}"),
            TextColumn("{task.fields[rate]} samples/s"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=console,
            disable=not enabled,
            transient=False,
        )
        self.task = self.progress.add_task("train", total=total, loss="-", rate="-")

    def __enter__(self) -> TrainingProgress:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def on_event(self, event: dict[str, Any]) -> None:
        if event.get("event") == "progress":
            self.progress.update(
                self.task,
                completed=event["step"],
                loss=f"{event['loss']:.4f}",
                rate=f"{event['samples_per_s']:.0f}",
            )


class RichReporter:
    """orchestrate.Reporter on a rich console: notes, rank-0 lines, and a progress bar per run."""

    def __init__(self, console: Console, progress: bool = True) -> None:
        self.console = console
        self.enabled = progress and console.is_terminal
        self.bar: TrainingProgress | None = None

    def begin(self, label: str, steps: int) -> None:
        self.close()
        if label:
            self.console.print(f"[bold]{label}[/]", highlight=False)
        if self.enabled and steps:
            self.bar = TrainingProgress(self.console, steps).__enter__()

    def note(self, text: str) -> None:
        self.console.print(text, highlight=False)

    def line(self, text: str) -> None:
        self.console.print(text, markup=False, highlight=False)

    def event(self, event: dict[str, Any]) -> None:
        if self.bar is not None:
            self.bar.on_event(event)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.__exit__()
            self.bar = None


def cost_label(s: RunSummary) -> str:
    return "cost (sacct, every incarnation)" if s.cost_source == "sacct" else "cost (allocation x training)"


def energy_text(joules: float | None) -> str:
    return "not measured" if joules is None else f"{joules / 3.6e6:.4f} kWh"


def mesh_text(s: RunSummary) -> str:
    """The layout's degrees, outermost first (pipeline stages x replicas x tensor parallelism), as
    each part of the summary names its own (its mesh_dim); nothing for plain data parallelism."""
    dims = [d for v in s.parts.values() if (d := getattr(v, "mesh_dim", lambda: None)()) is not None]
    if not dims:
        return ""
    dp = s.world_size // math.prod(n for _, n, _ in dims)
    shard = shard_degree(s)
    replicas = f"{dp} replica(s)" + (f" ({shard} shards)" if shard > 1 else "")
    texts = [t for outer, _, t in dims if outer] + [replicas] + [t for outer, _, t in dims if not outer]
    return " · " + " x ".join(texts)


def summary_table(s: RunSummary) -> Table:
    """The run summary; rows of quantities the run did not measure (a script that reports no
    steps, or no split of them) are left out rather than shown as NaN."""
    known = math.isfinite
    parts = rows_of(s)
    title = f"{s.model} · {s.precision} · {s.world_size} ranks" + mesh_text(s)
    t = Table(title=title + (f" · global batch {s.global_batch}" if s.timed_steps else ""), show_header=True)
    t.add_column("metric")
    t.add_column("value", justify="right")
    t.add_column("share of step", justify="right")
    if known(s.throughput_samples_per_s):
        t.add_row("throughput", f"{s.throughput_samples_per_s:.1f} samples/s", "")
        t.add_row("  per rank", f"{s.throughput_per_rank:.1f} samples/s", "")
    if not s.timed_steps:
        t.add_row("wall time", f"{s.finished - s.started:.1f} s", "")
    if s.compile_s > 0:  # in the warm-up steps: not in the step times below
        t.add_row("torch.compile (warm-up, slowest rank)", f"{s.compile_s:.1f} s", "")
    if known(s.step_s):
        t.add_row("step time (mean)", f"{1e3 * s.step_s:.2f} ms", "100%")
    for label, seconds, sh in (
        ("  compute (fwd+bwd+update)", s.compute_s, s.compute_share),
        ("  exposed communication", s.comm_s, s.comm_share),
        ("  data wait", s.data_s, s.data_share),
    ):
        if known(seconds):
            t.add_row(label, f"{1e3 * seconds:.2f} ms", f"{100 * sh:.1f}%")
        if label.startswith("  compute"):
            for row in parts["compute"]:
                t.add_row(*row)
        if label.endswith("communication") and known(s.imbalance_s) and s.world_size > 1:
            slowest = min(s.per_rank, key=lambda r: r.wait_s if known(r.wait_s) else math.inf)
            t.add_row(
                "    of which waiting for the slowest rank",
                f"{1e3 * s.imbalance_s:.2f} ms",
                f"{100 * s.imbalance_s / s.step_s:.1f}% (slowest: rank {slowest.rank})",
            )
    for row in parts["step"]:
        t.add_row(*row)
    roof = for_run(s)
    if roof is not None:
        t.add_row(
            f"  roofline ({roof.messages} message(s), {roof.grad_bytes / 2**20:.2f} MiB)",
            f"expected {1e3 * roof.expected_s:.2f} ms",
            f"{roof.bound}-bound, waits {roof.exposed_s / roof.expected_s:.2f}x that"
            if roof.exposed_s > roof.expected_s
            else f"{roof.bound}-bound, {100 * roof.overlap:.0f}% hidden",
        )
    if s.tflops_per_rank is not None:
        t.add_row(
            "model FLOP/s per rank",
            f"{s.tflops_per_rank:.3g} TFLOP/s",
            f"MFU {100 * s.mfu:.1f}% of {s.peak_tflops:.3g} ({s.peak_source})"
            + (": above 100%, so that peak is too low" if s.mfu > 1 else "")
            if s.mfu is not None and s.peak_tflops is not None
            else f"MFU unknown ({s.peak_source})",
        )
    if known(s.node_hours):
        t.add_row(cost_label(s), f"{s.node_hours:.4f} node-h", f"{s.core_hours:.4f} core-h")
        t.add_row("  energy", energy_text(s.energy_j), "")
    if s.restarts:
        t.add_row(
            "restarts after a failure",
            str(s.restarts),
            f"{s.steps_redone} step(s) redone, {s.restart_node_hours_lost:.4f} node-h lost",
        )
    if s.nodes_excluded or s.nodes_lost:
        left = [f"{', '.join(s.nodes_excluded)} (pre-flight)"] if s.nodes_excluded else []
        left += [f"{', '.join(s.nodes_lost)} (lost)"] if s.nodes_lost else []
        t.add_row("nodes left out", "; ".join(left), "")
    if known(s.step_p50_s):
        t.add_row("step time p50 / p95", f"{1e3 * s.step_p50_s:.2f} / {1e3 * s.step_p95_s:.2f} ms", "")
    t.add_row("peak memory (max rank)", f"{max(s.peak_memory_bytes) / 2**20:.0f} MiB", "")
    for row in parts["memory"]:
        t.add_row(*row)
    if known(s.first_loss):
        t.add_row("loss first → last", f"{s.first_loss:.4f} → {s.last_loss:.4f}", LOSS_NOTE)
    if s.heldout_accuracy is not None:
        t.add_row("held-out accuracy", f"{100 * s.heldout_accuracy:.1f}%", "samples never trained on")
    t.add_row("timed steps", str(s.timed_steps), "")
    return t


# what the loss row's two figures are: the progress lines show one rank's loss of one step
LOSS_NOTE = f"last: mean of {LAST_LOSS_STEPS} steps, all ranks"


def summary_advice(s: RunSummary) -> list[str]:
    """What the run summary advises, as prose for below the table (a table cell would make the
    table as wide as the advice in a log file)."""
    roof = for_run(s)
    out = [] if roof is None else [f"to communicate faster: {roof.knob}"]
    return out + [metric for metric, _, _ in rows_of(s)["advice"]]  # each part's (part_rows.py)


def print_summary(console: Console, s: RunSummary) -> None:
    """The summary table, then its advice wrapped to PROSE_WIDTH columns."""
    console.print(summary_table(s))
    for advice in summary_advice(s):
        console.print(
            textwrap.fill(advice, PROSE_WIDTH, subsequent_indent="  "), markup=False, highlight=False
        )
