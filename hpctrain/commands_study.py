"""`hpctrain study strong|weak`, `hpctrain study resume DIR` and `hpctrain analyze DIR`."""
from __future__ import annotations

import argparse
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from rich.console import Console

from . import records
from .analysis.analyze import STUDY, analyze_dir
from .analysis.report import terminal_table, write_report
from .config import load_config, validate
from .config.load import load_configs
from .commands_run import facts_for
from .config.schema import Config
from .config.validate import world_size
from .errors import HpctrainError
from .facts import HostFacts
from .plan import default_run_dir
from .study import expand_study


def cmd_study(args: argparse.Namespace, console: Console) -> int:
    if args.kind == "resume":
        if not args.overrides:
            raise HpctrainError("usage: hpctrain study resume STUDY_DIR")
        return run_study(Path(args.overrides[0]).resolve(), args, console)
    user = [*args.overrides, f"study={args.kind}"]
    base = load_config(user, args.config_dir)
    points = expand_study(base)
    configs = load_configs([[*user, *p.overrides] for p in points], args.config_dir)
    facts = facts_for(base)
    for cfg in configs:
        validate(cfg, facts)  # every point is checked before the first one starts
    stem = default_run_dir(base, datetime.now())
    study_dir = (stem.parent / f"{stem.name}-{args.kind}").resolve()
    manifest = {"kind": args.kind, "cluster": base.cluster.name, "config_dir": args.config_dir,
                "allreduce_bench": bool(base.study and base.study.allreduce_bench),
                "allreduce_max_mb": base.study.allreduce_max_mb if base.study else 256,
                "runs": [{"name": p.name, "scale": p.scale, "rep": p.rep, "world_size": world_size(c),
                          "overrides": [*user, *p.overrides], "run_dir": str(study_dir / p.name)}
                         for p, c in zip(points, configs)]}
    if args.dry_run:
        for r in manifest["runs"]:
            print(f"{r['name']}: {' '.join(r['overrides'])}")
        return 0
    (study_dir.parent).mkdir(parents=True, exist_ok=True)
    study_dir.mkdir()
    records.write_json(study_dir / STUDY, manifest)
    console.print(f"[bold]study[/] {args.kind}: {len(points)} runs -> {study_dir}")
    return run_study(study_dir, args, console, facts)


def _pending(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in manifest["runs"] if not (Path(r["run_dir"]) / records.SUMMARY).exists()]


def _set_aside(run_dir: Path) -> None:
    """A failed attempt's directory is kept, renamed, never overwritten."""
    if run_dir.exists():
        run_dir.rename(run_dir.with_name(f"{run_dir.name}.failed-{int(time.time())}"))


def run_study(study_dir: Path, args: argparse.Namespace, console: Console, facts: HostFacts | None = None) -> int:
    manifest = records.read_json(study_dir / STUDY)
    todo = _pending(manifest)
    done = len(manifest["runs"]) - len(todo)
    if done:
        console.print(f"{done} run(s) already finished; running the other {len(todo)}")
    # every run's config, composed once: the pending ones run, and each world size's first one
    # gives the resources of its allreduce benchmark
    configs = dict(zip((r["name"] for r in manifest["runs"]),
                       load_configs([r["overrides"] for r in manifest["runs"]], manifest.get("config_dir"))))
    if manifest["cluster"] == "slurm":
        _run_slurm(study_dir, manifest, todo, configs, args, console)
    else:
        _run_local(study_dir, manifest, todo, configs, args, console, facts or HostFacts.gather())
    return cmd_analyze_dir(study_dir, console)


def _run_local(study_dir: Path, manifest: dict[str, Any], todo: list[dict[str, Any]], configs: dict[str, Config],
               args: argparse.Namespace, console: Console, facts: HostFacts) -> None:
    from .bench.allreduce import run_allreduce
    from .commands_run import train_locally

    for i, r in enumerate(todo):
        cfg = configs[r["name"]]
        console.print(f"[bold]study run {i + 1}/{len(todo)}:[/] {r['name']} ({r['world_size']} ranks)")
        _set_aside(Path(r["run_dir"]))
        try:
            train_locally(cfg, facts, Path(r["run_dir"]), args, console)
        except HpctrainError as e:  # one failed point does not stop the study; analyze lists it
            console.print(f"[red]{r['name']} failed:[/] {str(e).splitlines()[0]}")
    if manifest.get("allreduce_bench"):
        for n in sorted({r["world_size"] for r in manifest["runs"] if r["world_size"] > 1}):
            out = study_dir / f"allreduce-n{n}.json"
            if not out.exists():
                console.print(f"allreduce benchmark on {n} ranks")
                run_allreduce(n, out, manifest.get("allreduce_max_mb", 256) * 2**20)


def _run_slurm(study_dir: Path, manifest: dict[str, Any], todo: list[dict[str, Any]], configs: dict[str, Config],
               args: argparse.Namespace, console: Console) -> None:
    from .launch.slurm import Point, submit_allreduce, submit_sweep, wait
    from .plan_slurm import plan_slurm

    for r in todo:
        _set_aside(Path(r["run_dir"]))
    folder = str(study_dir / "submitit")
    points = [Point(i, r["overrides"], configs[r["name"]],
                    plan_slurm(configs[r["name"]], r["run_dir"], sys.executable, folder))
              for i, r in enumerate(todo)]
    sweep = submit_sweep(study_dir / f"attempt-{int(time.time())}", points) if points else {"runs": [], "arrays": []}
    console.print(f"submitted {len(points)} run(s) as {len(sweep['arrays'])} job array(s)")
    jobs = [r["job_id"] for r in sweep["runs"]]
    if manifest.get("allreduce_bench"):
        # once per world size, on the resources of a point of that size
        shapes: dict[int, Config] = {}
        for r in manifest["runs"]:
            shapes.setdefault(r["world_size"], configs[r["name"]])
        for n, cfg in sorted(shapes.items()):
            out = study_dir / f"allreduce-n{n}.json"
            if n > 1 and not out.exists():
                plan = plan_slurm(cfg, str(study_dir / "allreduce"), sys.executable, folder)
                jobs.append(submit_allreduce(plan, out, manifest.get("allreduce_max_mb", 256) * 2**20, folder))
                console.print(f"submitted the allreduce benchmark on {n} ranks")
    if jobs:
        wait(jobs, args.timeout_min * 60, poll_s=2.0)


def cmd_analyze_dir(study_dir: Path, console: Console, out: Path | None = None) -> int:
    a = analyze_dir(study_dir)
    if not a.points:
        raise HpctrainError(f"no finished run in {study_dir} (missing: {len(a.missing)})")
    paths = write_report(a, out or study_dir / "report")
    console.print(terminal_table(a))
    if a.missing:
        console.print(f"[yellow]{len(a.missing)} run(s) missing or failed:[/] " + ", ".join(Path(m).name for m in a.missing))
    console.print(f"report: {paths['html']}  ({paths['markdown'].name}, {paths['csv'].name}, "
                  f"{', '.join(p.name for k, p in paths.items() if k not in ('csv', 'markdown', 'html'))})")
    return 0


def cmd_analyze(args: argparse.Namespace, console: Console) -> int:
    return cmd_analyze_dir(Path(args.path).resolve(), console, Path(args.out) if args.out else None)
