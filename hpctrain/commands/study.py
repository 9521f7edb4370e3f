"""`hpctrain study strong|weak`, `hpctrain study resume DIR` and `hpctrain analyze DIR`: parse,
call study_run / analysis, render."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from hpctrain import records
from hpctrain.analysis.analyze import analyze_dir
from hpctrain.analysis.report import (
    cost_lines,
    mfu_lines,
    model_lines,
    roofline_lines,
    terminal_table,
    write_report,
)
from hpctrain.commands.traces import has_traces, show_traces
from hpctrain.commands.ui import RichReporter
from hpctrain.errors import HpctrainError, RecordError
from hpctrain.orchestrate.study_run import create_study, load_study, run_study, write_study

# the analysis job's script (study --analyze-as-job); by path: it imports this module
REPORT_SCRIPT = Path(__file__).with_name("study_report.py")


def cmd_study(args: argparse.Namespace, console: Console) -> int:
    if args.kind == "resume":
        if len(args.overrides) != 1:
            raise HpctrainError("usage: hpctrain study resume STUDY_DIR")
        study_dir = Path(args.overrides[0]).resolve()
        load_study(study_dir)
    elif args.estimate or args.estimate_from:
        return _estimate(args, console)
    else:
        study_dir, manifest, dated = create_study(
            args.kind,
            args.overrides,
            args.config_dir,
            say=lambda s: console.print(f"note: {s}", highlight=False),
            admit=not args.dry_run,
        )
        if args.dry_run:
            for r in manifest.runs:
                print(f"{r.name}: {' '.join(r.overrides)}")
            return 0
        study_dir, manifest = write_study(study_dir, manifest, dated)
        console.print(
            f"[bold]study[/] {args.kind}: {len(manifest.runs)} runs -> {study_dir}", highlight=False
        )
    reporter = RichReporter(console, progress=not args.no_progress)
    if args.analyze_as_job:
        return _submit_as_jobs(study_dir, reporter, console)
    try:
        run_study(study_dir, reporter, args.timeout_min * 60)
    finally:
        reporter.close()
    return analyze_and_report(study_dir, console)


def _submit_as_jobs(study_dir: Path, reporter: RichReporter, console: Console) -> int:
    from hpctrain.orchestrate.study_job import submit_study

    done = submit_study(study_dir, reporter, REPORT_SCRIPT)
    a = done.analysis
    if done.drives:
        console.print(
            f"submitted the study as job {a.job_id}: it holds the largest point's nodes and runs every "
            f"point as a job step of itself, then the analysis; its report will be {study_dir / records.REPORT}/ "
            f"(its output: hpctrain logs {a.run_dir})",
            highlight=False,
        )
        console.print(f"follow it: hpctrain status {study_dir}", highlight=False)
        return 0
    console.print(
        f"submitted {len(done.runs)} run(s) and {len(done.benchmarks)} allreduce benchmark(s): jobs "
        f"{' '.join(j.job_id for j in done.runs + done.benchmarks) or '-'}",
        highlight=False,
    )
    console.print(
        f"the analysis is job {a.job_id}, after every one of them: its report will be "
        f"{study_dir / records.REPORT}/ (its output: hpctrain logs {a.run_dir})",
        highlight=False,
    )
    console.print(f"follow it: hpctrain status {study_dir}", highlight=False)
    return 0


def _estimate(args: argparse.Namespace, console: Console) -> int:
    from hpctrain.commands.estimate import cmd_estimate
    from hpctrain.orchestrate.estimate import study_points

    launcher, points = study_points(args.kind, args.overrides, args.config_dir)
    return cmd_estimate(args, console, launcher, points, f"estimate: {args.kind} study of {len(points)} runs")


def analyze_and_report(study_dir: Path, console: Console, out: Path | None = None) -> int:
    a = analyze_dir(study_dir)
    if not a.points:
        raise HpctrainError(f"no finished run in {study_dir} (missing: {len(a.missing)})")
    paths = write_report(a, out or study_dir / records.REPORT)
    console.print(terminal_table(a))
    # one line each, never wrapped: people grep these and paste them into notes
    for line in model_lines(a):  # the fits and their validation, as in the Markdown report
        console.print(line, highlight=False, soft_wrap=True)
    for line in roofline_lines(a):
        console.print(f"roofline {line}", highlight=False, soft_wrap=True)
    for line in mfu_lines(a) + cost_lines(a):
        console.print(line, highlight=False, soft_wrap=True)
    if a.missing:
        console.print(
            f"[yellow]{len(a.missing)} run(s) missing or failed:[/] "
            + ", ".join(Path(m).name for m in a.missing),
            highlight=False,
        )
    for c in a.corrupt:
        console.print(f"[yellow]unreadable:[/] {c}", highlight=False)
    console.print(
        f"report: {paths['html']}  ({paths['markdown'].name}, {paths['csv'].name}, "
        f"{', '.join(p.name for k, p in paths.items() if k not in ('csv', 'markdown', 'html'))})",
        highlight=False,
    )
    return 0


def cmd_analyze(args: argparse.Namespace, console: Console) -> int:
    path = Path(args.path).resolve()
    if (path / records.TUNE).exists():  # a tune: its table and best settings, from tune.json
        from hpctrain.commands.tune import show_tune_dir

        return show_tune_dir(path, console)
    if not (path / records.STUDY).exists():  # a run: its trace summary, if it was profiled
        if has_traces(path):
            return show_traces(path, console)
        if (path / records.JOB).exists():
            raise RecordError(
                f"{path} is a run without profiler traces: analyze takes a study directory, or a run "
                f"profiled with profile.enabled=true; this run's figures: hpctrain status {path}"
            )
    return analyze_and_report(path, console, Path(args.out) if args.out else None)
