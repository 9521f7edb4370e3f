"""Submission to SLURM with submitit: runs grouped into one job array per resource shape.

Every run directory gets `job.json` (job id, submitit folder) so that status/logs/cancel work
from the directory alone.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import submitit
from submitit.core import utils
from submitit.core.utils import FailedJobError

from hpctrain import records
from hpctrain.errors import LaunchError
from hpctrain.launch.base import Job, RunSpec
from hpctrain.launch.rundir import prepare_run_dir, write_run_files
from hpctrain.launch.slurm import scheduler
from hpctrain.launch.slurm.job import ArrayTask, TrainingJob
from hpctrain.launch.slurm.limits import Limits
from hpctrain.launch.slurm.plan import SlurmPlan
from hpctrain.launch.slurm.scheduler import NOT_SUBMITTED, Answer


class ArrayExecutor(submitit.SlurmExecutor):
    """submitit's SLURM executor, with one pickle per job array instead of one per task: the
    array's function (job.ArrayTask) holds every task's run directory, and the name each task's
    entry point reads (`<array>_<i>_submitted.pkl`) is a hard link to that one file (a copy
    where the file system has no hard links). 10,000 points: 10,000 links, not 10,000 pickles."""

    def submit_runs_array(self, run_dirs: list[str]) -> list[str]:
        """sbatch --array over the run directories; the tasks' job ids."""
        folder = utils.JobPaths.get_first_id_independent_folder(self.folder)
        folder.mkdir(parents=True, exist_ok=True)
        pickle = folder / f".array-{uuid.uuid4().hex}.pkl"
        delayed = utils.DelayedSubmission(ArrayTask(run_dirs))
        delayed.set_timeout(self.parameters.get("time", 5), self.max_num_timeout)
        delayed.dump(pickle)
        try:
            array = submitit.SlurmExecutor(self.folder, self.max_num_timeout, python=self.python)
            array.update_parameters(**self.parameters)
            array.parameters["map_count"] = len(run_dirs)
            first = array._submit_command(self._submitit_command_str)
            ids = [f"{first.job_id}_{i}" for i in range(len(run_dirs))]
            for job_id in ids:
                task_pickle = utils.JobPaths(self.folder, job_id=job_id).submitted_pickle
                try:
                    os.link(pickle, task_pickle)
                except OSError:  # no hard links here (or too many): a copy
                    shutil.copyfile(pickle, task_pickle)
        finally:
            pickle.unlink(missing_ok=True)
        return ids


def _executor(plan: SlurmPlan) -> ArrayExecutor:
    ex = ArrayExecutor(folder=plan.folder, max_num_timeout=plan.max_requeues, python=plan.python)
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


def _sbatch(ex: ArrayExecutor, plan: SlurmPlan, array: list[str] | None, patience_s: float = 60) -> list[str]:
    """submitit's sbatch call (one job, or one array over `array`) through the scheduler's door,
    as every SLURM command: counted, held to the rate, and submitted again with back-off only
    after a refusal that says the job was not accepted (NOT_SUBMITTED)."""
    ids: list[str] = []

    def submit(argv: Sequence[str], timeout_s: float) -> Answer:  # submitit sets no time limit
        try:
            ids[:] = ex.submit_runs_array(array) if array else [ex.submit(TrainingJob(plan.run_dir)).job_id]
        except FailedJobError as e:  # its text is sbatch's stderr
            return Answer(1, "", str(e))
        return Answer(0, "", "")

    answer = scheduler.ask(["sbatch"], patience_s=patience_s, again=NOT_SUBMITTED, runner=submit)
    if not answer.ok:
        raise FailedJobError(answer.err)
    return ids


def group_by_shape(runs: list[RunSpec[SlurmPlan]]) -> list[list[RunSpec[SlurmPlan]]]:
    """Runs that need the same resources share one sbatch script: one job array each."""
    groups: dict[str, list[RunSpec[SlurmPlan]]] = defaultdict(list)
    for r in runs:
        groups[r.plan.shape()].append(r)
    return list(groups.values())


def check_room(runs: list[RunSpec[SlurmPlan]], limits: Limits) -> None:
    """Refuse, before anything is submitted, a sweep the user's MaxSubmitJobs cannot hold."""
    room = limits.room()
    if room is not None and len(runs) > room:
        raise LaunchError(
            f"{len(runs)} run(s) exceed what SLURM lets you queue now: MaxSubmitJobs="
            f"{limits.max_submit_jobs} with {limits.queued} job(s) already pending or running "
            f"(room for {room}); submit the sweep in parts, or wait for jobs to finish"
        )


def submit_runs(runs: list[RunSpec[SlurmPlan]], limits: Limits) -> tuple[list[Job], list[records.ArrayRef]]:
    """One sbatch call for a single run; for several, one `sbatch --array` per resource shape,
    split into arrays of at most the cluster's MaxArraySize. (Launcher.admit has checked the
    user's submit limit before anything was written.)"""
    jobs: list[Job] = []
    arrays: list[records.ArrayRef] = []
    with records.one_sync():  # durable before sbatch, without an fsync per file
        for r in runs:
            write_run_files(prepare_run_dir(r.run_dir), r.cfg, r.plan)
    shapes = group_by_shape(runs)
    with records.one_sync():
        submit_groups(runs, shapes, limits, jobs, arrays)
    order = {str(r.run_dir): r.index for r in runs}
    jobs.sort(key=lambda j: order[str(j.run_dir)])
    return jobs, arrays


def submit_groups(
    runs: list[RunSpec[SlurmPlan]],
    shapes: list[list[RunSpec[SlurmPlan]]],
    limits: Limits,
    jobs: list[Job],
    arrays: list[records.ArrayRef],
) -> None:
    """One sbatch (--array) per part of each shape; each run's job.json as it is known."""
    for group in [[shape[i] for i in part] for shape in shapes for part in limits.arrays(len(shape))]:
        plan = group[0].plan
        ex = _executor(plan)
        with sbatch_errors():
            ids = _sbatch(ex, plan, [str(r.run_dir) for r in group] if len(runs) > 1 else None)
        if len(runs) > 1:
            arrays.append(records.ArrayRef(ids[0].split("_")[0], len(ids)))
        for r, job_id in zip(group, ids):
            ref = records.new(
                records.JobRef,
                launcher="slurm",
                job_id=job_id,
                world_size=r.plan.world_size,
                folder=r.plan.folder,
            )
            records.write(r.run_dir / records.JOB, ref, indent=None)  # durable by the sync below
            jobs.append(Job(r.run_dir, ref))
