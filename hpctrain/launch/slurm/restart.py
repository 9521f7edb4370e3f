"""Restarts of a SLURM run inside its allocation (train.max_restarts), as torchrun's
--max-restarts restarts its workers in place: the batch script's teardown (plan.py) runs

    python -m hpctrain.launch.slurm.restart FOLDER SRUN_STATUS

after srun's step ended. When the step failed in a way a restart can outlive (records/restarts.py)
and restarts are left, it records the restart and starts the same tasks again as a new job step
on the same nodes (no wait in the queue), which resume from the run's newest checkpoint; it
repeats while that is so and exits with the last step's status, so the job ends as its last
step did. A job that is no longer running (cancelled, or requeued at its time limit by submitit)
is left alone.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hpctrain import records
from hpctrain.launch.output import srun_failure
from hpctrain.lifeline import stat_fields
from hpctrain.records import State, restarts

SUBMIT_MODULE = "submitit.core._submit"


def job_id(env: Mapping[str, str]) -> str:
    """submitit's name for this job (an array task's: ARRAYJOB_TASK)."""
    if env.get("SLURM_ARRAY_JOB_ID"):
        return f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
    return env["SLURM_JOB_ID"]


def srun_argv(plan: Mapping[str, Any], folder: str, array: bool) -> list[str]:
    """The step submitit's batch script starts (its template: srun --unbuffered --output --error
    SRUN_ARGS PYTHON -u -m submitit.core._submit FOLDER), appending to the task logs."""
    pattern = "%A_%a" if array else "%j"
    executor = plan["executor"]
    return [
        "srun",
        "--unbuffered",
        "--open-mode=append",
        "--output",
        str(Path(folder) / f"{pattern}_%t_log.out"),
        "--error",
        str(Path(folder) / f"{pattern}_%t_log.err"),
        *[str(a) for a in executor.get("srun_args", [])],
        *shlex.split(str(plan["python"])),
        "-u",
        "-m",
        SUBMIT_MODULE,
        folder,
    ]


def job_state(jid: str) -> State:
    """SLURM's JobState of this job now (UNKNOWN when scontrol cannot tell)."""
    try:
        out = subprocess.run(
            ["scontrol", "show", "job", "-o", jid], capture_output=True, text=True, timeout=30
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return State.UNKNOWN
    for field in out.split():
        if field.startswith("JobState="):
            return State.of(field.removeprefix("JobState="))
    return State.UNKNOWN


def why_not(run_dir: Path, max_restarts: int, used: int, state: State) -> str | None:
    """None: restart the failed step; else why not."""
    if state != State.RUNNING and used < max_restarts:  # cancelled, or requeued: SLURM ends this script
        return f"not restarted: the job is {state}"
    return restarts.why_not(run_dir, max_restarts, used)


def cause(run_dir: Path, stderr: Path, offset: int) -> tuple[int | None, str]:
    """(rank, what failed): the rank's own error, else srun's report of the task that died."""
    first = records.first_error(run_dir, causes_only=True)
    if first is not None:
        return first.rank, first.describe()
    try:
        with open(stderr, errors="replace") as f:
            f.seek(offset)
            found = srun_failure(f.read()[-20000:])
    except OSError:
        found = None
    return found if found is not None else (None, "the job step failed")


def run_dir_of(folder: str, jid: str) -> Path:
    """The run this task trains, from submitit's pickle of it (launch/slurm/job.py)."""
    from submitit.core.utils import DelayedSubmission, JobPaths

    from hpctrain.launch.slurm.job import ArrayTask, TrainingJob

    fn = DelayedSubmission.load(JobPaths(folder, job_id=jid).submitted_pickle).function
    if isinstance(fn, ArrayTask):
        fn = fn.mine()
    if not isinstance(fn, TrainingJob):
        raise records.RecordError(f"{folder}: job {jid} runs {fn!r}, not an hpctrain run")
    return Path(fn.run_dir)


def main(argv: list[str]) -> int:
    folder, status = argv[0], int(argv[1])
    if status == 0:
        return 0
    env = dict(os.environ)
    jid = job_id(env)
    run_dir = run_dir_of(folder, jid)
    plan = records.read_json(run_dir / records.PLAN)
    max_restarts = int(plan.get("max_restarts", 0))
    stderr = Path(folder) / f"{jid}_0_log.err"
    started, offset = _job_start(env), 0
    nodes = int(env.get("SLURM_JOB_NUM_NODES", "1"))
    while status != 0:
        why = why_not(run_dir, max_restarts, len(restarts.read_restarts(run_dir)), job_state(jid))
        if why is not None:
            if max_restarts:
                print(f"hpctrain: {why}", file=sys.stderr, flush=True)
            return status
        rank, what = cause(run_dir, stderr, offset)
        restart = restarts.restart_for(run_dir, what, rank, nodes, started)
        restarts.set_aside(run_dir)
        restarts.record(run_dir, restart)
        print(
            f"hpctrain: {restart.describe()} (a new job step on the same nodes)", file=sys.stderr, flush=True
        )
        started = time.time()
        offset = stderr.stat().st_size if stderr.exists() else 0
        env[restarts.ATTEMPT_VAR] = str(int(env.get(restarts.ATTEMPT_VAR, "0") or 0) + 1)
        status = subprocess.call(srun_argv(plan, folder, "SLURM_ARRAY_JOB_ID" in env), env=env)
    return status


def _job_start(env: Mapping[str, str]) -> float:
    """When the job started: SLURM's word, else when the batch script (this process's parent) did
    (its start in clock ticks after boot, /proc/PID/stat field 22)."""
    value = env.get("SLURM_JOB_START_TIME", "")
    if value.isdigit():
        return float(value)
    fields = stat_fields(f"/proc/{os.getppid()}/stat")
    try:
        with open("/proc/stat") as f:
            boot = next(float(line.split()[1]) for line in f if line.startswith("btime "))
        return boot + int(fields[19]) / os.sysconf("SC_CLK_TCK") if fields else time.time()
    except (OSError, StopIteration, ValueError):
        return time.time()


def checked(argv: list[str]) -> int:
    """main, whatever goes wrong: the job keeps its step's status, and the batch log gets one line
    (not a traceback) saying why no restart was tried."""
    status = int(argv[1]) if len(argv) == 2 and argv[1].lstrip("-").isdigit() else 1
    try:
        return main(argv)
    except Exception as e:  # noqa: BLE001 - a damaged pickle or plan, scontrol missing, ...
        print(f"hpctrain: no restart tried: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        return status


if __name__ == "__main__":
    sys.exit(checked(sys.argv[1:]))
