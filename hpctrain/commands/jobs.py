"""`hpctrain status | logs | cancel` for runs, sweeps and studies of any launcher, by directory."""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

from rich.console import Console
from rich.table import Table

from hpctrain import records
from hpctrain.errors import LaunchError, RecordError
from hpctrain.events import parse_event
from hpctrain.launch.registry import load_job
from hpctrain.orchestrate import runs as orchestrate
from hpctrain.orchestrate.progress import PROGRESS_NOTE, progress_of
from hpctrain.orchestrate.sweep import split_common, state_rank
from hpctrain.records import State
from hpctrain.records.preflight import checks as preflight_checks
from hpctrain.records.preflight import verdicts_text
from hpctrain.records.restarts import read_restarts

SHOWN = 50  # rows of a large sweep's table (the counts above cover every run; --all lists all)


def status(path: Path, console: Console, show_all: bool = False) -> int:
    """A sweep or study: counts by state first, then the failed and running points, then the
    rest; the overrides all points share once, above, and per row only what varies. A sweep of
    more than SHOWN runs lists the first SHOWN in that order (a 10,000-row table takes seconds
    to draw and nobody reads it), and says how to see the rest."""
    found = orchestrate.statuses(orchestrate.jobs_in(path))
    found.sort(key=lambda f: state_rank(f[1].state))  # stable: submission order within a state
    by_name = orchestrate.overrides_in(path)
    # what varies between a study's points (its benchmarks and analysis job have no overrides)
    names = [job.run_dir.name for job, _, _ in found]
    common, known = split_common([by_name[n] for n in names if n in by_name])
    told = iter(known)
    varying = [next(told) if n in by_name else [] for n in names]
    unstarted = orchestrate.unstarted_in(path)
    if len(found) + len(unstarted) > 1:
        counts = Counter([st.state for _, st, _ in found] + ["NOT STARTED"] * len(unstarted))
        console.print(
            f"{len(found) + len(unstarted)} runs: "
            + ", ".join(f"{counts[k]} {k.lower()}" for k in sorted(counts, key=state_rank)),
            highlight=False,
        )
    if common and len(found) > 1:
        console.print("common to every run: " + " ".join(common), highlight=False)
    table = Table(title=f"status of {path}")
    columns = ["run", "job", "state", "nodes", "elapsed", "progress", "error"]
    if any(varying):
        columns.insert(1, "varies")
    for col in columns:
        table.add_column(col)
    rows = list(zip(found, varying))
    hidden = 0 if show_all else max(0, len(rows) - SHOWN)
    for (job, st, error), own in rows[: len(rows) - hidden]:
        color = {State.COMPLETED: "green", State.RUNNING: "cyan", State.FAILED: "red"}.get(st.state, "yellow")
        row = [
            job.run_dir.name,
            job.job_id,
            f"[{color}]{st.state}[/]",
            str(st.nodes) if st.nodes is not None else "-",
            st.elapsed,
            progress_of(job.run_dir),
            (error or st.reason) + (" (it can never start as submitted: cancel it)" if st.blocked else "")
            if st.state != State.COMPLETED
            else "",
        ]
        if any(varying):
            row.insert(1, " ".join(own))
        table.add_row(*row)
    for name, why in unstarted:  # a study's runs without a job
        own = [" ".join(o for o in by_name.get(name, []) if o not in common)] if any(varying) else []
        table.add_row(name, *own, "-", "[yellow]NOT STARTED[/]", "-", "-", "-", why)
    console.print(table)
    console.print(f"[dim]{PROGRESS_NOTE}[/]", highlight=False, soft_wrap=True)
    for source in sorted({st.source for _, st, _ in found if st.source}):  # accounting down or off
        console.print(f"note: {source}", highlight=False, markup=False)
    for (job, _, _), _own in rows[: len(rows) - hidden]:  # what each restart cost (records/restarts.py)
        for r in read_restarts(job.run_dir):
            console.print(f"{job.run_dir.name}: {r.describe()}", highlight=False, markup=False)
        for i, check in enumerate(preflight_checks(job.run_dir), 1):
            console.print(
                f"{job.run_dir.name}: pre-flight check {i}: {verdicts_text(check)}",
                highlight=False,
                markup=False,
            )
    if hidden:
        rest = Counter(st.state for (_, st, _), _ in rows[len(rows) - hidden :])
        console.print(
            f"{hidden} more run(s) not listed ({', '.join(f'{n} {k.lower()}' for k, n in rest.items())}): "
            f"hpctrain status {path} --all lists every run",
            highlight=False,
        )
    return 0


def _print_lines(lines: list[str]) -> None:
    for line in lines:
        if parse_event(line) is None:  # progress events are for the progress bar, not for people
            print(line, flush=True)


def logs(run_dir: Path, rank: int, follow: bool, console: Console) -> int:
    if not (run_dir / records.JOB).exists():
        raise RecordError(f"{run_dir} is not a run directory (no {records.JOB})")
    job = load_job(run_dir)
    launcher = orchestrate.launcher_of(job)
    if rank < 0 or rank >= job.ref.world_size:
        raise LaunchError(f"--rank {rank} is not a rank of this run (0..{job.ref.world_size - 1})")
    paths = launcher.log_paths(job, rank)
    offsets = {p: 0 for p in paths}
    if not follow and not any(p.exists() for p in paths):
        raise LaunchError(f"no log for rank {rank} yet (looked for {', '.join(map(str, paths))})")
    while True:
        for p in paths:
            lines, offsets[p] = records.read_new_lines(p, offsets[p])
            _print_lines(lines)
        state = launcher.status([job]).get(job.job_id)  # None: the scheduler does not list it yet
        if not follow or (state is not None and state.done):
            for p in paths:  # what was written between the last read and the end
                _print_lines(records.read_new_lines(p, offsets[p])[0])
            return 0
        time.sleep(1.0)


NEVER_AFTER_CANCEL = ("afterok", "aftercorr")  # sbatch(1) --dependency kinds a cancel never satisfies


def cancel(path: Path, console: Console, with_dependents: bool = False) -> int:
    jobs, ended = orchestrate.cancel(path)
    if jobs:
        console.print(f"cancelled {len(jobs)} job(s): {' '.join(j.job_id for j in jobs)}", highlight=False)
    if ended:
        console.print(
            f"already ended: {', '.join(f'{j.job_id} ({st.state})' for j, st in ended)}", highlight=False
        )
    found = orchestrate.dependents(jobs + [j for j, _ in ended])
    waiting = [w for group in found.values() for w in group]
    ids = [job_id for job_id, _ in waiting]
    if not ids:
        return 0
    if not with_dependents and sys.stdin.isatty():
        answer = console.input(f"{len(ids)} job(s) wait on these ({' '.join(ids)}): cancel them too? [y/N] ")
        with_dependents = answer.strip().lower() in ("y", "yes")
    if with_dependents:
        orchestrate.cancel_dependents(found)
        console.print(f"cancelled {len(ids)} job(s) that waited on them: {' '.join(ids)}", highlight=False)
    else:
        # afterok (hpctrain run --after DIR) never starts after a cancel; afterany (DIR:any),
        # afternotok and after start once these have ended
        never = [job_id for job_id, how in waiting if how in NEVER_AFTER_CANCEL]
        start = [job_id for job_id, how in waiting if how not in NEVER_AFTER_CANCEL]
        if never:
            console.print(
                f"{len(never)} job(s) wait on these: {' '.join(never)}; they can never start after a "
                f"cancelled job (afterok): hpctrain cancel {path} --with-dependents",
                highlight=False,
            )
        if start:
            console.print(
                f"{len(start)} job(s) wait on these to end: {' '.join(start)}; they start now that these "
                f"have (afterany): hpctrain cancel {path} --with-dependents cancels them too",
                highlight=False,
            )
    return 0


def cmd_status(args: argparse.Namespace, console: Console) -> int:
    return status(args.path, console, show_all=args.all)


def cmd_logs(args: argparse.Namespace, console: Console) -> int:
    return logs(args.path, args.rank, args.follow, console)


def cmd_cancel(args: argparse.Namespace, console: Console) -> int:
    return cancel(args.path, console, args.with_dependents)
