"""`hpctrain run`: parse, call orchestrate, render. One run or a sweep (-m), on any launcher."""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from hpctrain import records
from hpctrain.analysis.summaries import container_line
from hpctrain.commands.track import tracking_for
from hpctrain.commands.ui import RichReporter, print_summary
from hpctrain.config import load_config, to_yaml
from hpctrain.errors import ConfigError, Problem, RecordError
from hpctrain.launch.base import Job, JobStatus
from hpctrain.orchestrate import runs as orchestrate
from hpctrain.orchestrate.sweep import split_common
from hpctrain.records import LAST_LOSS_STEPS, State

STUDY = re.compile(r"^[+~]*study([./=@]|$)")  # the study group or its keys


def _no_study(overrides: list[str]) -> None:
    study = [o for o in overrides if STUDY.match(o)]
    if study:
        raise ConfigError(
            [
                Problem(
                    study[0].split("=")[0].lstrip("+~"),
                    "is read by `hpctrain study`; `hpctrain run` would ignore it",
                    "run the study: hpctrain study strong|weak ..., or drop it",
                )
            ]
        )


def cmd_run(args: argparse.Namespace, console: Console) -> int:
    _no_study(args.overrides)
    if args.cfg:
        print(to_yaml(load_config(args.overrides, args.config_dir)), end="")
        return 0
    if args.estimate or args.estimate_from:
        return _estimate(args, console)
    prep = orchestrate.prepare(
        args.overrides,
        args.config_dir,
        args.multirun,
        after=args.after,
        say=lambda t: console.print(f"[dim]{t}[/]", highlight=False),
    )
    launcher = prep.launcher
    if args.dry_run:
        if prep.group_dir is None:
            print("# resolved config\n" + to_yaml(prep.runs[0].cfg))
            print(f"# run directory\n{prep.runs[0].run_dir}\n")
        print(launcher.describe(prep.runs), end="")
        return 0
    jobs = orchestrate.start(
        prep,
        detach=args.no_wait,
        say=lambda t: console.print(t, highlight=False),
        timeout_s=args.timeout_min * 60,
    )
    where = prep.group_dir or prep.runs[0].run_dir
    console.print(
        launcher.started_message(prep.runs, jobs) + f"; {'sweep' if prep.group_dir else 'run'} "
        f"directory {where}",
        highlight=False,
    )
    for note in prep.runs[0].plan.notes:
        console.print(f"[yellow]note:[/] {note}")
    if args.no_wait:
        console.print(
            f"follow it with: hpctrain status {where}   /   hpctrain logs {jobs[0].run_dir} --follow",
            highlight=False,
        )
        if prep.runs[0].cfg.tracking.mlflow or prep.runs[0].cfg.tracking.tensorboard:
            console.print(
                f"tracking: nothing waits to send it; when it ends: hpctrain track {where}", highlight=False
            )
        return 0
    ended: dict[Path, State] = {}
    live = tracking_for(where, prep.runs[0].cfg, console, lambda d: ended.get(d, State.RUNNING))
    jobs, states = _follow(prep, jobs, args, console, live.poll if live else None)
    if live is not None:
        ended.update({j.run_dir: states[j.job_id].state for j in jobs if states[j.job_id].done})
        live.finish()
        if live.where():
            console.print(live.where(), highlight=False)
    if prep.group_dir is None:
        summary = orchestrate.result(launcher, jobs[0], states[jobs[0].job_id])
        print_summary(console, summary)
        box = container_line(jobs[0].run_dir)
        if box:
            console.print(f"container: {box}", highlight=False)
        console.print(f"records: {jobs[0].run_dir}", highlight=False)
        return 0
    rows = []
    for r, job in zip(prep.runs, jobs):
        st = states[job.job_id]
        if st.state != State.COMPLETED and launcher.sequential:
            console.print(
                f"[red]point {r.index} failed:[/] {str(launcher.failure(job, st)).splitlines()[0]}",
                highlight=False,
            )
        rows.append((r.overrides, job.run_dir, st.state))
    return sweep_table(console, prep.group_dir, rows)


def _estimate(args: argparse.Namespace, console: Console) -> int:
    from hpctrain.commands.estimate import cmd_estimate
    from hpctrain.orchestrate.estimate import run_points

    launcher, points = run_points(args.overrides, args.config_dir, args.multirun)
    title = f"estimate: {'sweep of ' + str(len(points)) + ' points' if args.multirun else 'the run'}"
    return cmd_estimate(args, console, launcher, points, title)


def _follow(
    prep: orchestrate.Prepared, jobs: list[Job], args: argparse.Namespace, console: Console, tick: Any
) -> tuple[list[Job], dict[str, JobStatus]]:
    """Follow the jobs to their end; a run whose pre-flight check judged nodes bad goes again
    without them (orchestrate.resubmitted). The jobs that ended, and their states."""
    launcher, reporter = prep.launcher, RichReporter(console, progress=not args.no_progress)
    labels = (
        [f"sweep point {r.index + 1}/{len(prep.runs)}: {' '.join(r.overrides)}" for r in prep.runs]
        if prep.group_dir is not None
        else []
    )
    timeout_s = args.timeout_min * 60
    try:
        states = orchestrate.follow(
            launcher, jobs, reporter, timeout_s, labels, [r.cfg.train.steps for r in prep.runs], tick=tick
        )
        if prep.group_dir is None:
            again = lambda js: orchestrate.follow(launcher, js, reporter, timeout_s, tick=tick)  # noqa: E731
            job, states = orchestrate.resubmitted(
                launcher, prep.runs[0], jobs[0], states, again, reporter.note
            )
            jobs = [job]
    finally:
        reporter.close()
    return jobs, states


def sweep_table(console: Console, sweep_dir: Path, rows: Sequence[tuple[list[str], Path, str]]) -> int:
    common, varying = split_common([overrides for overrides, _, _ in rows])
    table = Table(
        title=f"sweep {sweep_dir}", caption="common to every point: " + " ".join(common) if common else None
    )
    # the summary's figures, as `hpctrain status` and the run's own summary show them
    for col in (
        "#",
        "varies",
        "state",
        "samples/s",
        "step ms",
        "comm share",
        f"loss, last {LAST_LOSS_STEPS} steps",
    ):
        table.add_column(col)
    failed = 0
    for (_, run_dir, state), overrides in zip(rows, varying):
        try:
            s: records.RunSummary | None = records.read(run_dir / records.SUMMARY, records.RunSummary)
        except RecordError:
            s = None
        failed += state != State.COMPLETED
        table.add_row(
            run_dir.name,
            " ".join(overrides),
            state,
            f"{s.throughput_samples_per_s:.1f}" if s else "-",
            f"{1e3 * s.step_s:.1f}" if s else "-",
            f"{100 * s.comm_share:.1f}%" if s else "-",
            f"{s.last_loss:.4f}" if s and math.isfinite(s.last_loss) else "-",  # what each point learnt
        )
    console.print(table)
    return 4 if failed else 0
