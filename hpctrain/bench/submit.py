"""`hpctrain bench submit`: time to plan and submit N-point single-shape sweeps to SLURM (several
sizes: how the time grows, as the exponent of a power law), how many times sbatch ran (counted by
a shim in front of the real commands; the target is one call per array), what `hpctrain status`
of the sweep costs, and every SLURM command each asked of the controller and the accounting
daemon (sbatch, squeue, sacct, scontrol, sacctmgr, sinfo, scancel, counted the same way). Then
what waiting an hour for the largest sweep would ask, on a fake clock (bench/waiting.py), beside
the way that asks accounting at every look. The submitted jobs are cancelled afterwards: this
measures the control plane, not training."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from hpctrain.bench.analyze import growth
from hpctrain.bench.waiting import ARRAY_PARALLELISM, HOUR_S, sacct_every_look, simulate
from hpctrain.errors import LaunchError
from hpctrain.launch.slurm.launcher import SlurmLauncher
from hpctrain.launch.slurm.watcher import look
from hpctrain.orchestrate import runs as orchestrate

COUNTED = ("sbatch", "squeue", "sacct", "scontrol", "sacctmgr", "sinfo", "scancel")


def _count_calls() -> Path:
    """Put counting SLURM commands first on this process's PATH; return the file they append their
    names to. Only this process's own calls are counted: the submitted jobs inherit the PATH
    (sbatch exports the environment), and a task that starts before the jobs are cancelled asks
    scontrol too."""
    shim = Path(tempfile.mkdtemp(prefix="hpctrain-bench-"))
    log = shim / "calls"
    log.touch()
    for tool in COUNTED:
        real = shutil.which(tool)
        if real is None:
            raise LaunchError(
                f"{tool} not found: bash slurm/start.sh, then export "
                "SLURM_CONF=/tmp/hpctrain-slurm/etc/slurm.conf"
            )
        (shim / tool).write_text(
            f'#!/bin/sh\n[ "$PPID" = {os.getpid()} ] && echo {tool} >> {log}\nexec {real} "$@"\n'
        )
        (shim / tool).chmod(0o755)
    os.environ["PATH"] = f"{shim}:{os.environ['PATH']}"
    return log


def _calls(log: Path, tool: str) -> int:
    return log.read_text().split().count(tool)


def _all_calls(log: Path) -> dict[str, int]:
    return {tool: _calls(log, tool) for tool in COUNTED}


def _since(before: dict[str, int], log: Path) -> dict[str, int]:
    now = _all_calls(log)
    return {t: now[t] - before[t] for t in COUNTED if now[t] - before[t]}


def calls_text(calls: dict[str, int]) -> str:
    return ", ".join(f"{n} {t}" for t, n in calls.items() if n) + f" = {sum(calls.values())}"


@dataclass(frozen=True)
class Measured:
    points: int
    arrays: int
    sbatch: int
    target: int  # sbatch calls: one per array of at most MaxArraySize runs
    plan_s: float
    submit_s: float
    status_s: float
    submit_calls: dict[str, int]  # every SLURM command planning and submitting made, by name
    status_calls: dict[str, int]  # those `hpctrain status` of the sweep made


def measure(points: int, out: Path, calls: Path) -> Measured:
    """Plan and submit an N-point sweep, ask its status as `hpctrain status` would, cancel it."""
    before = _all_calls(calls)
    t0 = time.perf_counter()
    prep = orchestrate.prepare(
        [
            "cluster=slurm",
            f"train.seed=range({points})",
            "data=digits",
            "train.steps=2",
            "train.warmup_steps=0",
            f"run.output_root={out}",
            "run.name=submit",
        ],
        multirun=True,
    )
    t1 = time.perf_counter()
    jobs = orchestrate.start(prep, detach=True)
    t2 = time.perf_counter()
    submit_calls = _since(before, calls)
    sweep_dir = prep.group_dir or prep.runs[0].run_dir
    asked = _all_calls(calls)
    orchestrate.statuses(orchestrate.jobs_in(sweep_dir))  # what `hpctrain status` asks
    t3 = time.perf_counter()
    status_calls = _since(asked, calls)
    launcher = prep.launcher
    launcher.cancel(jobs)
    if not isinstance(launcher, SlurmLauncher):
        raise LaunchError(f"bench submit measures SLURM submission, not {type(launcher).__name__}")
    target = len(launcher.limits(prep.runs).arrays(points))
    arrays = len({j.job_id.split("_")[0] for j in jobs})
    sbatch = submit_calls.get("sbatch", 0)
    return Measured(points, arrays, sbatch, target, t1 - t0, t2 - t1, t3 - t2, submit_calls, status_calls)


def run_submit(args: argparse.Namespace, console: Console) -> int:
    if subprocess.run(["scontrol", "ping"], capture_output=True).returncode != 0:
        raise LaunchError(
            "no SLURM controller answers: start the local cluster with bash slurm/start.sh "
            "and export SLURM_CONF=/tmp/hpctrain-slurm/etc/slurm.conf"
        )
    calls = _count_calls()
    out = Path(args.out).resolve()
    sizes = sorted(set(args.points))
    rows = [measure(n, out, calls) for n in sizes]
    table = Table(title="bench submit: single-shape sweeps to the local SLURM cluster (jobs cancelled after)")
    for col in (
        "points",
        "arrays",
        "sbatch calls",
        "plan s",
        "submit s",
        "per point ms",
        "status s",
        "SLURM commands: submit",
        "status",
    ):
        table.add_column(col, justify="right")
    for m in rows:
        table.add_row(
            str(m.points),
            str(m.arrays),
            f"{m.sbatch} (target {m.target})",
            f"{m.plan_s:.2f}",
            f"{m.submit_s:.2f}",
            f"{1e3 * (m.plan_s + m.submit_s) / m.points:.2f}",
            f"{m.status_s:.2f}",
            calls_text(m.submit_calls),
            calls_text(m.status_calls),
        )
    console.print(table)
    if len(rows) > 1:
        ns = [m.points for m in rows]
        console.print(
            f"growth from {ns[0]} to {ns[-1]} points, t ~ n^k: plan k = {growth(ns, [m.plan_s for m in rows]):.2f}, "
            f"submit k = {growth(ns, [m.submit_s for m in rows]):.2f}, status k = "
            f"{growth(ns, [m.status_s for m in rows]):.2f}",
            highlight=False,
        )
    _print_waiting(console, rows[-1].points)
    ok = all(m.sbatch == m.target for m in rows)
    for m in rows:
        verdict = "[green]meets[/]" if m.sbatch == m.target else "[red]misses[/]"
        console.print(
            f"{m.sbatch} sbatch call(s) for {m.points} points ({verdict} the target of {m.target}: one per "
            f"array of at most MaxArraySize runs); the jobs were cancelled; records in {out}",
            highlight=False,
        )
    return 0 if ok else 1


def _print_waiting(console: Console, points: int) -> None:
    """An hour's wait for a `points`-task sweep, on a fake clock: hpctrain's looks beside asking
    accounting at every look (the way before, and submitit's)."""
    table = Table(
        title=f"waiting for a {points}-task sweep whose tasks end over an hour (fake clock, {ARRAY_PARALLELISM} at a time)"
    )
    for col in ("way", "looks", "SLURM commands", "job records read from accounting", "last end seen after"):
        table.add_column(col, justify="right")
    for name, way in (("hpctrain", look), ("sacct at every look", sacct_every_look)):
        w = simulate(points, way)
        table.add_row(
            name, str(w.looks), calls_text(w.counts), f"{w.sacct_rows:,}", f"{w.noticed_s - HOUR_S:.0f} s"
        )
    console.print(table)
