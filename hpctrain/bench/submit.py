"""`hpctrain bench submit`: time to plan and submit an N-point single-shape sweep to SLURM, how
many times sbatch ran (counted by a shim in front of the real sbatch; the target is one call per
array), and what `hpctrain status` of the sweep costs: its time and its sacct and squeue calls
(counted the same way). The submitted jobs are cancelled afterwards: this measures the control
plane, not training."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from hpctrain.errors import LaunchError
from hpctrain.orchestrate import runs as orchestrate

COUNTED = ("sbatch", "sacct", "squeue")


def _count_calls() -> Path:
    """Put a counting sbatch, sacct and squeue first on this process's PATH; return the file they
    append their names to."""
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
        (shim / tool).write_text(f'#!/bin/sh\necho {tool} >> {log}\nexec {real} "$@"\n')
        (shim / tool).chmod(0o755)
    os.environ["PATH"] = f"{shim}:{os.environ['PATH']}"
    return log


def _calls(log: Path, tool: str) -> int:
    return log.read_text().split().count(tool)


def run_submit(args: argparse.Namespace, console: Console) -> int:
    if subprocess.run(["scontrol", "ping"], capture_output=True).returncode != 0:
        raise LaunchError(
            "no SLURM controller answers: start the local cluster with bash slurm/start.sh "
            "and export SLURM_CONF=/tmp/hpctrain-slurm/etc/slurm.conf"
        )
    calls = _count_calls()
    t0 = time.perf_counter()
    out = Path(args.out).resolve()
    prep = orchestrate.prepare(
        [
            "cluster=slurm",
            f"train.seed=range({args.points})",
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
    n_calls = _calls(calls, "sbatch")
    sweep_dir = prep.group_dir or prep.runs[0].run_dir
    before = (_calls(calls, "sacct"), _calls(calls, "squeue"))
    found = orchestrate.statuses(orchestrate.jobs_in(sweep_dir))  # what `hpctrain status` asks
    t3 = time.perf_counter()
    status_calls = (_calls(calls, "sacct") - before[0], _calls(calls, "squeue") - before[1])
    prep.launcher.cancel(jobs)
    arrays = {j.job_id.split("_")[0] for j in jobs}
    table = Table(title=f"bench submit: {args.points}-point single-shape sweep to the local SLURM cluster")
    for col in ("measure", "value"):
        table.add_column(col)
    table.add_row("points", str(args.points))
    table.add_row("job arrays", str(len(arrays)))
    table.add_row("sbatch calls (counted)", str(n_calls))
    table.add_row("plan (expand + compose + validate + plan)", f"{t1 - t0:.2f} s")
    table.add_row("submit (run dirs + pickles + sbatch)", f"{t2 - t1:.2f} s")
    table.add_row("total per point", f"{1e3 * (t2 - t0) / args.points:.1f} ms")
    table.add_row(f"status of the sweep ({len(found)} runs)", f"{t3 - t2:.2f} s")
    table.add_row("  sacct / squeue calls (counted)", f"{status_calls[0]} / {status_calls[1]}")
    console.print(table)
    # one call per array; arrays are as large as the cluster's MaxArraySize allows
    target = len(prep.launcher.limits(prep.runs).arrays(args.points))  # type: ignore[attr-defined]
    verdict = "[green]meets[/]" if n_calls == target else "[red]misses[/]"
    console.print(
        f"{n_calls} sbatch call(s) for {args.points} points ({verdict} the target of {target}: one per "
        f"array of at most MaxArraySize runs); the jobs were cancelled; records in {prep.group_dir}",
        highlight=False,
    )
    return 0 if n_calls == target else 1
