"""`hpctrain track DIR`: send a run, sweep or study to MLflow and/or TensorBoard (again) from its
records, e.g. from a login node after an offline cluster's runs; and the live tracking of
`hpctrain run`."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from rich.console import Console

from hpctrain import records
from hpctrain.config.observe_rules import uri_problem
from hpctrain.config.schema import Config
from hpctrain.errors import ConfigError, HpctrainError, Problem, RecordError
from hpctrain.launch.registry import load_job
from hpctrain.orchestrate import runs as orchestrate
from hpctrain.records import State
from hpctrain.tracking.groups import LiveTracking, members, track, where


def tracking_for(
    path: Path, cfg: Config, console: Console, state_of: Callable[[Path], State]
) -> LiveTracking | None:
    """Live tracking for `hpctrain run` (None: the config tracks nothing)."""
    if not (cfg.tracking.mlflow or cfg.tracking.tensorboard):
        return None
    return LiveTracking(
        path,
        lambda text: console.print(f"[yellow]warning:[/] {text}", highlight=False, soft_wrap=True),
        state_of,
    )


def state_of(run_dir: Path) -> State:
    """The run's state as its launcher tells it; a directory without a job (copied records):
    COMPLETED if it has a summary."""
    try:
        ((_, status, _),) = orchestrate.statuses([load_job(run_dir)])
        return status.state
    except (RecordError, HpctrainError, ValueError):
        return State.COMPLETED if (run_dir / records.SUMMARY).exists() else State.FAILED


def cmd_track(args: argparse.Namespace, console: Console) -> int:
    path = Path(args.path).resolve()
    if args.uri is not None and (problem := uri_problem(args.uri)):
        raise ConfigError(
            [
                Problem(
                    "--uri", problem, "give the store's URI: sqlite:///abs/path/mlflow.db or http://host:5000"
                )
            ]
        )
    if not path.is_dir():
        raise HpctrainError(f"{path} is not a directory")
    warnings: list[str] = []
    _, runs = members(path)
    for run_dir, _ in runs:  # runs nobody waited for (--no-wait): their cost from accounting now
        if (run_dir / records.JOB).exists() and state_of(run_dir) == State.COMPLETED:
            job = load_job(run_dir)
            orchestrate.accounted(orchestrate.launcher_of(job), job)
    t, n = track(path, args.uri, args.tensorboard, warnings.append, state_of)
    for w in warnings:
        console.print(f"[yellow]warning:[/] {w}", highlight=False, soft_wrap=True)
    kind, _ = members(path)
    console.print(f"tracked {n} run(s) of {kind} {path}", highlight=False)
    if t is not None:
        console.print(where(path, kind, t), highlight=False)
    return 1 if warnings else 0
