"""`hpctrain preflight`: the pre-flight check of a run's nodes alone (cluster.preflight with
only=true): the ranks the run would start (mpirun locally, a short job on SLURM) time their GEMM
and their ring of links, judge every node and stop. Nothing is resubmitted: the verdicts are the
answer. Exit 0 when every node is good, 4 when one is bad."""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.table import Table

from hpctrain.commands.ui import RichReporter
from hpctrain.errors import RecordError
from hpctrain.orchestrate import runs as orchestrate
from hpctrain.records import State
from hpctrain.records.preflight import checks

ONLY = ["cluster.preflight.enabled=true", "cluster.preflight.only=true", "cluster.preflight.max_resubmits=0"]


def cmd_preflight(args: argparse.Namespace, console: Console) -> int:
    prep = orchestrate.prepare([*args.overrides, *ONLY], args.config_dir, False)
    launcher, spec = prep.launcher, prep.runs[0]
    if args.dry_run:
        print(launcher.describe(prep.runs), end="")
        return 0
    [job] = orchestrate.start(prep, detach=False)
    console.print(
        launcher.started_message(prep.runs, [job]) + f"; run directory {job.run_dir}", highlight=False
    )
    reporter = RichReporter(console, progress=False)
    try:
        states = orchestrate.follow(launcher, [job], reporter, args.timeout_min * 60)
    finally:
        reporter.close()
    done = checks(job.run_dir)
    if not done:  # the ranks ended before they judged: the failure says why
        status = states[job.job_id]
        if status.state == State.COMPLETED:
            raise RecordError(f"{job.run_dir}: the ranks ended without writing preflight.json")
        raise launcher.failure(job, status)
    check = done[-1]
    table = Table(title=f"pre-flight check of {spec.cfg.cluster.name} (tolerance {check.get('tolerance')})")
    for col in ("node", "TFLOP/s", "held to", "link GB/s", "held to", "verdict"):
        table.add_column(col)
    bad = 0
    verdicts = check.get("verdicts")
    for v in verdicts if isinstance(verdicts, list) else []:
        if not isinstance(v, dict):
            continue
        bad += bool(v.get("bad"))
        link = float(v.get("link_gbps") or 0.0)
        table.add_row(
            str(v.get("host")),
            f"{float(v.get('tflops') or 0.0):.3g}",
            f"{float(v.get('tflops_reference') or 0.0):.3g}",
            f"{link:.2f}" if link else "-",
            f"{float(v.get('link_reference') or 0.0):.2f}" if link else "-",
            f"BAD: {v.get('why')}" if v.get("bad") else "good",
        )
    console.print(table)
    if not check.get("links_measured"):
        console.print("links: not measured (one rank, or no point-to-point path between the ranks)")
    console.print(f"records: {job.run_dir}/preflight.json", highlight=False)
    return 4 if bad else 0
