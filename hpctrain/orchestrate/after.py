"""Runs that start after other runs (run.after, `hpctrain run --after DIR[:ok|:any]`): the jobs
named by run, sweep and study directories; held by the scheduler where there is one (SLURM's
--dependency, launch/slurm/launcher.py), else waited for here before the run starts."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

from hpctrain.config.schema import Config
from hpctrain.errors import ConfigError, LaunchError, Problem, RecordError
from hpctrain.launch.base import After, Job, JobStatus, Launcher
from hpctrain.orchestrate.started import by_launcher, jobs_in, launcher_of
from hpctrain.records import State

MODES = {"ok": True, "any": False}


def parse_after(entry: str) -> tuple[Path, bool]:
    """DIR, DIR:ok or DIR:any -> (DIR, whether each job must complete). Pure."""
    head, sep, mode = entry.rpartition(":")
    if sep and mode in MODES:
        return Path(head).expanduser(), MODES[mode]
    if sep and "/" not in mode and mode:
        raise ConfigError.one(
            "run.after",
            f"{entry!r} ends in :{mode}",
            "end it in :ok (the default: each job completes) or :any",
        )
    return Path(entry).expanduser(), True


def waits_for(entries: Sequence[str]) -> list[After]:
    """The jobs each entry's directory holds, read from its records before anything starts."""
    out: list[After] = []
    problems: list[Problem] = []
    for entry in entries:
        path, ok = parse_after(entry)
        try:
            jobs = jobs_in(path)
        except (RecordError, OSError) as e:
            problems.append(
                Problem("run.after", f"{entry}: {e}", "name a run, sweep or study directory hpctrain started")
            )
            continue
        if not jobs:
            problems.append(Problem("run.after", f"{entry}: no job was started there", "start it first"))
        out.extend(After(job, ok) for job in jobs)
    if problems:
        raise ConfigError(problems)
    return out


def held(launcher: Launcher, configs: list[Config]) -> tuple[list[Config], list[After]]:
    """The configs, held by the launcher's scheduler until their run.after have ended where it
    can; else the same configs and the jobs the command must wait for before starting them."""
    entries = list(dict.fromkeys(e for c in configs for e in c.run.after))
    if not entries:
        return configs, []
    after = waits_for(entries)
    out = [launcher.held_until(c, after) for c in configs]
    if all(c is not None for c in out):
        return [c for c in out if c is not None], []
    return configs, after


def wait_for(after: list[After], timeout_s: float, say: Callable[[str], None], poll_s: float = 1.0) -> None:
    """Wait until every job has ended; one that was to complete and did not stops the run from
    starting (as SLURM's DependencyNeverSatisfied would), naming it."""
    pending = list(after)
    said = False
    deadline = time.monotonic() + timeout_s
    while pending:
        states: dict[str, JobStatus] = {}
        for group in by_launcher([a.job for a in pending]).values():
            states.update(launcher_of(group[0]).status(group))
        still: list[After] = []
        for a in pending:
            st = states.get(a.job.job_id)
            if st is None or not st.done:
                still.append(a)
            elif a.ok and st.state != State.COMPLETED:
                raise LaunchError(never_satisfied(a.job, str(st.state)))
        pending = still
        if pending and not said:
            say(
                f"waiting for {len(pending)} earlier job(s) to end (run.after): {', '.join(a.job.job_id for a in pending)}"
            )
            said = True
        if pending and time.monotonic() > deadline:
            raise LaunchError(
                f"the jobs this run starts after are still running after {timeout_s:.0f} s; nothing was started"
            )
        if pending:
            time.sleep(poll_s)


def never_satisfied(job: Job, state: str) -> str:
    return (
        f"job {job.job_id} ({job.run_dir}) ended {state}, and this run was to start after it completed "
        "(run.after, :ok); nothing was started: run it again once that run completes, or use :any"
    )
