"""`hpctrain bench submit`: time to plan and submit an N-point single-shape sweep to SLURM, and
how many times sbatch ran (counted by a shim in front of the real sbatch; the target is 1).
The submitted jobs are cancelled afterwards: this measures submission, not training."""

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

from .. import orchestrate
from ..errors import LaunchError


def _count_sbatch_calls() -> Path:
    """Put a counting sbatch first on this process's PATH; return the file it appends to."""
    real = shutil.which("sbatch")
    if real is None:
        raise LaunchError(
            "sbatch not found: bash slurm/start.sh, then export SLURM_CONF=/tmp/hpctrain-slurm/etc/slurm.conf"
        )
    shim = Path(tempfile.mkdtemp(prefix="hpctrain-bench-"))
    log = shim / "calls"
    log.touch()
    (shim / "sbatch").write_text(f'#!/bin/sh\necho call >> {log}\nexec {real} "$@"\n')
    (shim / "sbatch").chmod(0o755)
    os.environ["PATH"] = f"{shim}:{os.environ['PATH']}"
    return log


def run_submit(args: argparse.Namespace, console: Console) -> int:
    if subprocess.run(["scontrol", "ping"], capture_output=True).returncode != 0:
        raise LaunchError(
            "no SLURM controller answers: start the local cluster with bash slurm/start.sh "
            "and export SLURM_CONF=/tmp/hpctrain-slurm/etc/slurm.conf"
        )
    calls = _count_sbatch_calls()
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
    n_calls = len(calls.read_text().splitlines())
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
