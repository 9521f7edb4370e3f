"""`hpctrain tune [overrides]` and `hpctrain tune --resume DIR`: parse, call orchestrate/tune.py,
render what was tried, what was left out and why, the best settings and their prediction."""

from __future__ import annotations

import argparse
import math
from datetime import datetime
from pathlib import Path

from rich.console import Console
from rich.table import Table

from hpctrain import records
from hpctrain.analysis.tune import override_text
from hpctrain.commands.estimate import memory_table
from hpctrain.errors import HpctrainError
from hpctrain.orchestrate.estimate import Point, memory_of
from hpctrain.orchestrate.tune import Tuned, held_text, plan_tune, read_tune, resume_tune, tune, tune_home


def _ms(x: float) -> str:
    return f"{1e3 * x:.2f}" if math.isfinite(x) else "-"


def tune_table(m: records.TuneManifest, title: str) -> Table:
    t = Table(
        title=title, caption="predicted: before the trial ran, from the trials so far (analysis/tune.py)"
    )
    for col in ("trial", "settings", "predicted ms", "step ms", "samples/s", "verdict"):
        t.add_column(col, justify="right" if "ms" in col or "/s" in col else "left")
    for x in [*m.trials, *m.left_out]:
        rate = f"{x.samples_per_s:.0f}" if math.isfinite(x.samples_per_s) else "-"
        settings = " ".join(x.changed) or "(the config as given)"
        t.add_row(x.name or "-", settings, _ms(x.predicted_s), _ms(x.step_s), rate, x.verdict)
    return t


def show_best(m: records.TuneManifest, console: Console, ranks: str) -> None:
    console.print(tune_table(m, f"tune: {len(m.trials)} trial(s), {len(m.left_out)} left out"))
    best = next((t for t in m.trials if t.name == m.best_trial), None)
    if best is None:
        console.print("no trial finished yet", highlight=False)
        return
    console.print(
        f"best: {' '.join(m.best) or 'the config as given'}: {best.samples_per_s:.0f} samples/s on {ranks} "
        f"rank(s) here ({m.best_trial}, step {_ms(best.step_s)} ms)",
        highlight=False,
        soft_wrap=True,
    )
    first = m.trials[0]
    if m.best_trial != first.name and math.isfinite(first.step_s):
        console.print(
            f"  {first.step_s / best.step_s:.2f}x the config as given ({_ms(first.step_s)} ms)",
            highlight=False,
        )


def show_tune_dir(home: Path, console: Console) -> int:
    """`hpctrain analyze TUNE_DIR`: what the tune recorded, nothing run or planned again."""
    m = read_tune(home)
    summary = home / m.best_trial / records.SUMMARY
    ranks = (
        str(records.read(summary, records.RunSummary).world_size)
        if m.best_trial and summary.exists()
        else "?"
    )
    show_best(m, console, ranks)
    if not m.finished:
        console.print(f"[yellow]unfinished:[/] go on with hpctrain tune --resume {home}", highlight=False)
    elif (home / records.BEST).exists():
        console.print(f"settings: {home / records.BEST}", highlight=False)
    return 0


def show_tuned(done: Tuned, console: Console) -> None:
    m, home = done.manifest, done.home
    show_best(m, console, str(done.tuning.cfg.cluster.world_size))
    if done.target is not None:
        e = done.target
        console.print(
            f"{e.target.label}: {e.throughput.text('.0f')} samples/s, step {e.step_s.text('.2f', 1e3)} ms "
            f"({e.how})",
            highlight=False,
            soft_wrap=True,
        )
    else:
        console.print(
            f"[yellow]no prediction at the target:[/] {done.no_target}", highlight=False, soft_wrap=True
        )
    console.print(
        f"settings: {home / records.BEST} (hpctrain run --overrides-file {home / records.BEST})",
        highlight=False,
        soft_wrap=True,
    )


def _dry_run(args: argparse.Namespace, console: Console) -> int:
    t = plan_tune(args.overrides, args.config_dir)
    for k in t.knobs:
        values = ", ".join(override_text(v) for v in k.values)
        console.print(f"{k.key}: {values} (now {dict(t.base)[k.key]}; {k.effect})", highlight=False)
    for why in t.invalid:
        console.print(f"[dim]left out: {why}[/]", highlight=False)
    home = tune_home(t.cfg, datetime.now())
    point = Point("the config as given", t.cfg, t.launcher.plan(t.cfg, home))
    console.print(memory_table(memory_of(t.launcher, [point], lambda _: None)))
    held = held_text(t, home)
    if held:
        console.print(held, highlight=False, markup=False, end="", soft_wrap=True)
    console.print(f"budget: {t.cfg.tune.budget_min:g} min; nothing was started", highlight=False)
    return 0


def cmd_tune(args: argparse.Namespace, console: Console) -> int:
    def say(text: str) -> None:
        console.print(f"[dim]{text}[/]", highlight=False, soft_wrap=True)

    timeout_s = args.timeout_min * 60
    if args.resume:
        if args.overrides:
            raise HpctrainError("hpctrain tune --resume DIR takes no overrides: the tune's own are used")
        done = resume_tune(Path(args.resume).resolve(), say, timeout_s)
    elif args.dry_run:
        return _dry_run(args, console)
    else:
        done = tune(args.overrides, args.config_dir, say, timeout_s)
    show_tuned(done, console)
    return 0
