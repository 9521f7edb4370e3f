"""Submission to SLURM with submitit: single runs, and sweeps as one job array per resource shape.

Every run directory gets `job.json` (job id, submitit folder) so that status/logs/cancel work
from the directory alone; a sweep directory gets `sweep.json`, the manifest that maps job ids to
overrides and run directories.
"""
from __future__ import annotations

import subprocess
import time
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import submitit
from submitit.core.utils import FailedJobError

from .. import records
from ..config.schema import Config
from ..errors import LaunchError, RankFailure
from ..plan_slurm import SlurmPlan
from .local import prepare_run_dir, write_run_files
from .sacct import JobState, sacct
from .slurm_job import AllreduceJob, TrainingJob

JOB = "job.json"
SWEEP = "sweep.json"


@dataclass
class Point:
    """One run of a sweep: its overrides, config and plan."""

    index: int
    overrides: list[str]
    cfg: Config
    plan: SlurmPlan


def _write_run(point_cfg: Config, plan: SlurmPlan) -> None:
    write_run_files(prepare_run_dir(Path(plan.run_dir)), point_cfg, plan)


def _executor(plan: SlurmPlan) -> submitit.SlurmExecutor:
    ex = submitit.SlurmExecutor(folder=plan.folder, max_num_timeout=plan.max_requeues,
                                python=plan.python)
    ex.update_parameters(**plan.executor)
    return ex


@contextmanager
def _sbatch_errors() -> Iterator[None]:
    """sbatch's refusal as a LaunchError carrying its message and what to check."""
    try:
        yield
    except (FailedJobError, subprocess.CalledProcessError) as e:
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise LaunchError(f"sbatch refused the job: {msg}\n  check the controller and partition with `sinfo`; "
                          "for the local test cluster: bash slurm/start.sh and export "
                          "SLURM_CONF=/tmp/hpctrain-slurm/etc/slurm.conf") from e
    except FileNotFoundError as e:
        raise LaunchError("sbatch not found: install slurm-client, or run on a cluster login node") from e


def submit_run(cfg: Config, plan: SlurmPlan) -> submitit.Job:
    _write_run(cfg, plan)
    with _sbatch_errors():
        job = _executor(plan).submit(TrainingJob(plan.run_dir))
    records.write_json(Path(plan.run_dir) / JOB, {"job_id": job.job_id, "folder": plan.folder,
                                                  "world_size": plan.world_size})
    return job


def group_by_shape(points: list[Point]) -> list[list[Point]]:
    """Points that need the same resources share one sbatch script: one job array each."""
    groups: dict[str, list[Point]] = defaultdict(list)
    for p in points:
        groups[p.plan.shape()].append(p)
    return list(groups.values())


def submit_sweep(sweep_dir: Path, points: list[Point],
                 on_submitted: Callable[[int], None] = lambda n: None) -> dict[str, Any]:
    """One `sbatch --array` per resource shape; returns (and writes) the sweep manifest."""
    manifest: dict[str, Any] = {"sweep_dir": str(sweep_dir), "arrays": [], "runs": []}
    for g, group in enumerate(group_by_shape(points)):
        for p in group:
            _write_run(p.cfg, p.plan)
        ex = _executor(group[0].plan)
        with _sbatch_errors(), ex.batch():
            jobs = [ex.submit(TrainingJob(p.plan.run_dir)) for p in group]
        manifest["arrays"].append({"array_id": jobs[0].job_id.split("_")[0], "size": len(jobs),
                                   "shape": group[0].plan.shape()})
        for p, job in zip(group, jobs):
            records.write_json(Path(p.plan.run_dir) / JOB, {"job_id": job.job_id, "folder": p.plan.folder,
                                                            "world_size": p.plan.world_size})
            manifest["runs"].append({"index": p.index, "overrides": p.overrides, "run_dir": p.plan.run_dir,
                                     "job_id": job.job_id, "array": g})
        on_submitted(len(jobs))
    manifest["runs"].sort(key=lambda r: r["index"])
    records.write_json(sweep_dir / SWEEP, manifest)
    return manifest


def submit_allreduce(plan: SlurmPlan, out: Path, max_bytes: int, folder: str) -> str:
    """The allreduce benchmark on the resources of `plan` (one world size of a study)."""
    ex = submitit.SlurmExecutor(folder=folder, max_num_timeout=0, python=plan.python)
    ex.update_parameters(**{**plan.executor, "job_name": "allreduce"})
    with _sbatch_errors():
        return ex.submit(AllreduceJob(str(out), 1024, max_bytes)).job_id


def run_dirs_and_jobs(path: Path) -> list[tuple[Path, str]]:
    """(run dir, job id) for a run directory or a sweep directory."""
    if (path / SWEEP).exists():
        return [(Path(r["run_dir"]), r["job_id"]) for r in records.read_json(path / SWEEP)["runs"]]
    if (path / JOB).exists():
        return [(path, records.read_json(path / JOB)["job_id"])]
    raise LaunchError(f"{path} is neither a SLURM run directory ({JOB}) nor a sweep directory ({SWEEP})")


def wait(job_ids: list[str], timeout_s: float, poll_s: float = 1.0,
         on_poll: Callable[[dict[str, JobState]], None] = lambda s: None) -> dict[str, JobState]:
    """Poll sacct until every job is done (sacct lags a job's end by a second or two)."""
    deadline = time.monotonic() + timeout_s
    while True:
        states = sacct(job_ids)
        on_poll(states)
        if len(states) == len(job_ids) and all(s.done for s in states.values()):
            return states
        if time.monotonic() > deadline:
            raise LaunchError(f"jobs {', '.join(job_ids)} not done after {timeout_s:.0f} s "
                              f"(states: {', '.join(f'{k}={v.state}' for k, v in states.items())})")
        time.sleep(poll_s)


def failure_of(run_dir: Path, state: JobState) -> RankFailure:
    first = records.first_error(run_dir)
    if first is not None:
        return RankFailure(first.get("rank"), f"{records.describe_error(first)}; job {state.job_id} {state.state}",
                           run_dir=str(run_dir))
    return RankFailure(None, f"job {state.job_id} ended {state.state} (exit code {state.exit_code})",
                       run_dir=str(run_dir))
