"""`hpctrain run`: one run or a sweep (-m), locally with mpirun or on SLURM with submitit."""
from __future__ import annotations

import argparse
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from . import records
from .config import load_config, to_yaml, validate
from .config.load import load_configs
from .config.schema import Config, LocalClusterConf, SlurmClusterConf
from .config.validate import world_size
from .errors import LaunchError
from .events import parse_event
from .facts import HostFacts
from .plan import GLOO_HOST, default_run_dir, plan_local
from .plan_slurm import plan_slurm
from .sweep import expand
from .ui import TrainingProgress, summary_table


def facts_for(cfg: Config) -> HostFacts | None:
    """Host checks apply where the ranks run on this machine."""
    return HostFacts.gather() if isinstance(cfg.cluster, LocalClusterConf) else None


def train_locally(cfg: Config, facts: HostFacts, run_dir: Path, args: argparse.Namespace,
              console: Console) -> dict[str, Any]:
    from .launch.local import GlooRendezvous, prepare_run_dir, run_local, write_run_files

    prepare_run_dir(run_dir)
    rendezvous = GlooRendezvous(GLOO_HOST, world_size(cfg)) if cfg.parallelism.backend == "gloo" else None
    try:
        plan = plan_local(cfg, facts, str(run_dir), sys.executable, rendezvous.port if rendezvous else None)
        write_run_files(run_dir, cfg, plan)
        console.print(f"[bold]run directory[/] {run_dir}")
        for note in plan.notes:
            console.print(f"[yellow]note:[/] {note}")
        with TrainingProgress(console, cfg.train.steps, enabled=not args.no_progress) as bar:
            return run_local(plan, lambda line: bar.print(line.text), bar.on_event)
    finally:
        if rendezvous:
            rendezvous.close()


class _LogFollower:
    """Feeds rank 0's submitit log (ordinary lines and progress events) to the progress bar."""

    def __init__(self, path: Path, bar: TrainingProgress) -> None:
        self.path, self.bar, self.offset = path, bar, 0

    def __call__(self, _states: object = None) -> None:
        lines, self.offset = records.read_new_lines(self.path, self.offset)
        for line in lines:
            event = parse_event(line)
            if event is not None:
                self.bar.on_event(event)
            elif not line.startswith("submitit "):
                self.bar.print(line)


def run_slurm(cfg: Config, run_dir: Path, args: argparse.Namespace, console: Console) -> dict[str, Any] | None:
    from .launch.slurm import failure_of, submit_run, wait

    plan = plan_slurm(cfg, str(run_dir), sys.executable)
    job = submit_run(cfg, plan)
    console.print(f"[bold]submitted[/] job {job.job_id} ({plan.nodes} node(s) x {plan.ranks_per_node} "
                  f"rank(s)); run directory {run_dir}")
    if args.no_wait:
        console.print(f"follow it with: hpctrain status {run_dir}   /   hpctrain logs {run_dir} --follow")
        return None
    with TrainingProgress(console, cfg.train.steps, enabled=not args.no_progress) as bar:
        follow = _LogFollower(Path(job.paths.stdout), bar)
        state = wait([job.job_id], args.timeout_min * 60, on_poll=follow)[job.job_id]
        follow()
    if state.state != "COMPLETED":
        raise failure_of(run_dir, state)
    return records.read_json(run_dir / records.SUMMARY)


def cmd_run(args: argparse.Namespace, console: Console) -> int:
    if args.multirun:
        return cmd_sweep(args, console)
    cfg = load_config(args.overrides, args.config_dir)
    if args.cfg:
        print(to_yaml(cfg), end="")
        return 0
    facts = facts_for(cfg)
    validate(cfg, facts)
    run_dir = default_run_dir(cfg, datetime.now()).resolve()
    if args.dry_run:
        return _dry_run(cfg, facts, run_dir)
    if isinstance(cfg.cluster, SlurmClusterConf):
        summary = run_slurm(cfg, run_dir, args, console)
    else:
        assert facts is not None  # local runs always gather facts
        summary = train_locally(cfg, facts, run_dir, args, console)
    if summary:
        console.print(summary_table(summary))
        console.print(f"records: {run_dir}")
    return 0


def _dry_run(cfg: Config, facts: HostFacts | None, run_dir: Path) -> int:
    print("# resolved config\n" + to_yaml(cfg))
    print(f"# run directory\n{run_dir}\n")
    if isinstance(cfg.cluster, SlurmClusterConf):
        print("# sbatch script (submitted by submitit; nothing was submitted)\n"
              + plan_slurm(cfg, str(run_dir), sys.executable).sbatch_script())
        return 0
    assert facts is not None
    plan = plan_local(cfg, facts, str(run_dir), sys.executable)
    for note in plan.notes:
        print(f"# note: {note}")
    print(f"# launch command\n{plan.command_line}")
    return 0


def cmd_sweep(args: argparse.Namespace, console: Console) -> int:
    """Validate every point first; then one job array per resource shape (SLURM) or one run
    after another (local)."""
    from .launch.slurm import Point, group_by_shape, submit_sweep, wait

    points = expand(args.overrides)
    configs = load_configs(points, args.config_dir)
    first = configs[0]
    facts = facts_for(first)
    for cfg in configs:
        validate(cfg, facts)
    now = datetime.now()
    base = default_run_dir(first, now)
    sweep_dir = (base.parent / f"{base.name}-sweep").resolve()
    if any(isinstance(c.cluster, SlurmClusterConf) for c in configs):
        if not all(isinstance(c.cluster, SlurmClusterConf) for c in configs):
            raise LaunchError("a sweep must use one launcher: all points cluster=slurm or all cluster=local")
        folder = str(sweep_dir / "submitit")
        plan_points = [Point(i, p, c, plan_slurm(c, str(sweep_dir / str(i)), sys.executable, folder))
                       for i, (p, c) in enumerate(zip(points, configs))]
        if args.dry_run:
            for group in group_by_shape(plan_points):
                print(f"# array of {len(group)} run(s): {[p.index for p in group]}")
                print(group[0].plan.sbatch_script(array_size=len(group)))
            return 0
        manifest = submit_sweep(sweep_dir, plan_points)
        console.print(f"[bold]submitted[/] {len(points)} runs as {len(manifest['arrays'])} job array(s): "
                      + ", ".join(a["array_id"] for a in manifest["arrays"]) + f"; sweep directory {sweep_dir}")
        if args.no_wait:
            return 0
        states = wait([r["job_id"] for r in manifest["runs"]], args.timeout_min * 60, poll_s=2.0)
        return _sweep_table(console, sweep_dir, [(r["overrides"], Path(r["run_dir"]), states[r["job_id"]].state)
                                                 for r in manifest["runs"]])
    if args.dry_run:
        for i, p in enumerate(points):
            print(f"# {i}: {' '.join(p)}")
        return 0
    assert facts is not None
    results = []
    for i, (p, cfg) in enumerate(zip(points, configs)):
        console.print(f"[bold]sweep point {i + 1}/{len(points)}:[/] {' '.join(p)}")
        try:
            train_locally(cfg, facts, sweep_dir / str(i), args, console)
            results.append((p, sweep_dir / str(i), "COMPLETED"))
        except LaunchError:
            raise
        except Exception as e:  # noqa: BLE001 - one failed point does not stop the sweep
            console.print(f"[red]point {i} failed:[/] {e}")
            results.append((p, sweep_dir / str(i), "FAILED"))
    return _sweep_table(console, sweep_dir, results)


def _sweep_table(console: Console, sweep_dir: Path, rows: list[tuple[list[str], Path, str]]) -> int:
    table = Table(title=f"sweep {sweep_dir}")
    for col in ("#", "overrides", "state", "samples/s", "step ms", "comm share"):
        table.add_column(col)
    failed = 0
    for overrides, run_dir, state in rows:
        s = records.read_json(run_dir / records.SUMMARY) if (run_dir / records.SUMMARY).exists() else None
        failed += state != "COMPLETED"
        table.add_row(run_dir.name, " ".join(overrides), state,
                      f"{s['throughput_samples_per_s']:.1f}" if s else "-", f"{s['step_ms']:.1f}" if s else "-",
                      f"{100 * s['comm_share']:.1f}%" if s else "-")
    console.print(table)
    return 4 if failed else 0
