"""Terminal presentation: the progress bar fed by rank-0 events, and the run summary table."""
from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                           TimeRemainingColumn)
from rich.table import Table


class TrainingProgress:
    """A progress bar over training steps, updated from `progress` events."""

    def __init__(self, console: Console, total: int, enabled: bool = True) -> None:
        self.progress = Progress(
            TextColumn("[bold]training"), BarColumn(), MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]}"), TextColumn("{task.fields[rate]} samples/s"),
            TimeElapsedColumn(), TimeRemainingColumn(), console=console, disable=not enabled,
            transient=False)
        self.task = self.progress.add_task("train", total=total, loss="-", rate="-")

    def __enter__(self) -> "TrainingProgress":
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def on_event(self, event: dict[str, Any]) -> None:
        if event.get("event") == "progress":
            self.progress.update(self.task, completed=event["step"], loss=f"{event['loss']:.4f}",
                                 rate=f"{event['samples_per_s']:.0f}")

    def print(self, text: str) -> None:
        self.progress.console.print(text, markup=False, highlight=False)


def summary_table(s: dict[str, Any]) -> Table:
    t = Table(title=f"{s.get('model', '?')} · {s.get('precision', '?')} · {s['world_size']} ranks "
                    f"· global batch {s['global_batch']}", show_header=True)
    t.add_column("metric")
    t.add_column("value", justify="right")
    t.add_column("share of step", justify="right")
    t.add_row("throughput", f"{s['throughput_samples_per_s']:.1f} samples/s", "")
    t.add_row("  per rank", f"{s['throughput_per_rank']:.1f} samples/s", "")
    t.add_row("step time (mean)", f"{s['step_ms']:.2f} ms", "100%")
    for part in ("compute", "comm", "data"):
        label = {"compute": "  compute (fwd+bwd+update)", "comm": "  exposed communication",
                 "data": "  data wait"}[part]
        t.add_row(label, f"{s[f'{part}_ms']:.2f} ms", f"{100 * s[f'{part}_share']:.1f}%")
    t.add_row("step time p50 / p95", f"{s['step_p50_ms']:.2f} / {s['step_p95_ms']:.2f} ms", "")
    mem = max(s["peak_memory_bytes"]) / 2**20
    t.add_row("peak memory (max rank)", f"{mem:.0f} MiB", "")
    t.add_row("loss first → last", f"{s['first_loss']:.4f} → {s['last_loss']:.4f}", "")
    t.add_row("timed steps", str(s["timed_steps"]), "")
    return t
