"""Submission to SLURM with submitit: runs grouped into one job array per resource shape.

Every run directory gets `job.json` (job id, submitit folder) so that status/logs/cancel work
from the directory alone.
"""

from __future__ import annotations

import subprocess
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager

import submitit
from submitit.core.utils import FailedJobError

from hpctrain import records
from hpctrain.errors import LaunchError
from hpctrain.launch.base import Job, RunSpec
from hpctrain.launch.rundir import prepare_run_dir, write_run_files
from hpctrain.launch.slurm.job import TrainingJob
from hpctrain.launch.slurm.limits import Limits
from hpctrain.launch.slurm.plan import SlurmPlan


def _executor(plan: SlurmPlan) -> submitit.SlurmExecutor:
    ex = submitit.SlurmExecutor(folder=plan.folder, max_num_timeout=plan.max_requeues, python=plan.python)
    ex.update_parameters(**plan.executor)
    return ex


@contextmanager
def sbatch_errors() -> Iterator[None]:
    """sbatch's refusal as a LaunchError carrying its message and what to check."""
    try:
        yield
    except (FailedJobError, subprocess.CalledProcessError) as e:
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise LaunchError(
            f"sbatch refused the job: {msg}\n  check the controller and partition with `sinfo`; "
            "for the local test cluster: bash slurm/start.sh and export "
            "SLURM_CONF=/tmp/hpctrain-slurm/etc/slurm.conf"
        ) from e
    except FileNotFoundError as e:
        raise LaunchError("sbatch not found: install slurm-client, or run on a cluster login node") from e


def group_by_shape(runs: list[RunSpec]) -> list[list[RunSpec]]:
    """Runs that need the same resources share one sbatch script: one job array each."""
    groups: dict[str, list[RunSpec]] = defaultdict(list)
    for r in runs:
        groups[r.plan.shape()].append(r)  # type: ignore[attr-defined]
    return list(groups.values())


def check_room(runs: list[RunSpec], limits: Limits) -> None:
    """Refuse, before anything is submitted, a sweep the user's MaxSubmitJobs cannot hold."""
    room = limits.room()
    if room is not None and len(runs) > room:
        raise LaunchError(
            f"{len(runs)} run(s) exceed what SLURM lets you queue now: MaxSubmitJobs="
            f"{limits.max_submit_jobs} with {limits.queued} job(s) already pending or running "
            f"(room for {room}); submit the sweep in parts, or wait for jobs to finish"
        )


def submit_runs(runs: list[RunSpec], limits: Limits) -> tuple[list[Job], list[records.ArrayRef]]:
    """One sbatch call for a single run; for several, one `sbatch --array` per resource shape,
    split into arrays of at most the cluster's MaxArraySize. (Launcher.admit has checked the
    user's submit limit before anything was written.)"""
    jobs: list[Job] = []
    arrays: list[records.ArrayRef] = []
    for r in runs:
        write_run_files(prepare_run_dir(r.run_dir), r.cfg, r.plan)
    shapes = group_by_shape(runs)
    for group in [[shape[i] for i in part] for shape in shapes for part in limits.arrays(len(shape))]:
        plan: SlurmPlan = group[0].plan  # type: ignore[assignment]
        ex = _executor(plan)
        with sbatch_errors():
            if len(runs) == 1:
                submitted = [ex.submit(TrainingJob(plan.run_dir))]
            else:
                with ex.batch():
                    submitted = [ex.submit(TrainingJob(str(r.run_dir))) for r in group]
        if len(runs) > 1:
            arrays.append(records.ArrayRef(submitted[0].job_id.split("_")[0], len(submitted)))
        for r, sj in zip(group, submitted):
            ref = records.new(
                records.JobRef,
                launcher="slurm",
                job_id=sj.job_id,
                world_size=r.plan.world_size,
                folder=r.plan.folder,  # type: ignore[attr-defined]
            )
            records.write(r.run_dir / records.JOB, ref)
            jobs.append(Job(r.run_dir, ref))
    order = {str(r.run_dir): r.index for r in runs}
    jobs.sort(key=lambda j: order[str(j.run_dir)])
    return jobs, arrays
