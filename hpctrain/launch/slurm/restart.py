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
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from hpctrain import records
from hpctrain.config.run_file import planned_config
from hpctrain.config.schema import Config
from hpctrain.launch.output import srun_failure, srun_node_failures, srun_reporting_nodes
from hpctrain.launch.slurm.exclude import resubmitted_without_bad_nodes
from hpctrain.launch.slurm.nodes import (
    hostnames,
    job_nodes,
    job_state,
    settled_losses,
    slurmd_timeout_s,
    step_env,
)
from hpctrain.lifeline import stat_fields
from hpctrain.parallel.elastic import resize
from hpctrain.records import State, restarts

SUBMIT_MODULE = "submitit.core._submit"


def job_id(env: Mapping[str, str]) -> str:
    """submitit's name for this job (an array task's: ARRAYJOB_TASK)."""
    if env.get("SLURM_ARRAY_JOB_ID"):
        return f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
    return env["SLURM_JOB_ID"]


def srun_argv(plan: Mapping[str, Any], folder: str, array: bool, place: Sequence[str] = ()) -> list[str]:
    """The step submitit's batch script starts (its template: srun --unbuffered --output --error
    SRUN_ARGS PYTHON -u -m submitit.core._submit FOLDER), appending to the task logs; `place`
    puts it on the nodes left (an elastic restart)."""
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
        *place,
        *shlex.split(str(plan["python"])),
        "-u",
        "-m",
        SUBMIT_MODULE,
        folder,
    ]


def why_not(run_dir: Path, max_restarts: int, used: int, state: State) -> str | None:
    """None: restart the failed step; else why not. A state scontrol could not tell (UNKNOWN)
    does not stop a restart: a job that did end takes its steps with it."""
    ended = state not in (State.RUNNING, State.UNKNOWN)
    if ended and used < max_restarts:  # cancelled, or requeued: SLURM ends this script
        return f"not restarted: the job is {state}"
    return restarts.why_not(run_dir, max_restarts, used)


START_SIGNALS = ("SIGSEGV", "SIGBUS")  # how a rank dies in MPI's start-up (PMIx's shared memory)
SCRIPT_START_S = 60.0  # a script's start: from rank 0's env.json to MPI_Init's end, with room


def start_fault(run_dir: Path, srun_said: str, done: Sequence[restarts.Restart]) -> tuple[int, str] | None:
    """(rank, cause) when the failed step is a start that died before the ranks met and may be
    retried once: srun saw a task die of SIGSEGV or SIGBUS, no rank wrote an error or a step,
    the ranks had not met, and no start was retried before. Open MPI's PMIx start under `srun
    --mpi=pmix` segfaults now and then in rank 0 (its shared-memory store, in MPI_Init: a
    script's hvd.init() as much as the built-in trainer's); the same start then succeeds."""
    if any(r.start for r in done) or records.first_error(run_dir) is not None:
        return None
    if restarts.steps_done(run_dir):
        return None
    when = _before_meeting(run_dir)
    if when is None:
        return None
    found = srun_failure(srun_said)
    if found is None or not any(f"({sig})" in found[1] for sig in START_SIGNALS):
        return None
    return found[0], f"{found[1]} {when}"


def _before_meeting(run_dir: Path) -> str | None:
    """How the start stood when it died, or None once the ranks had met. The built-in trainer
    writes env.json, with the hosts, after its first collective (one that cannot be read is
    taken as written); a script's rank 0 writes it before the script runs, whose own meeting
    (hvd.init, init_process_group) hpctrain does not see: before its first step it counts."""
    path = run_dir / records.ENV
    try:
        written = path.stat().st_mtime
    except FileNotFoundError:
        return "before the ranks met"
    except OSError:
        return None
    try:
        env = records.read_json(path)
    except records.RecordError:
        return None
    script = isinstance(env, dict) and "script" in env and "hosts" not in env
    # a script that records no steps (unmodified) is "before its first step" throughout: only
    # its first minute counts as its start, not a crash an hour in
    started = time.time() - written < SCRIPT_START_S
    return "before the script's first step" if script and started else None


def _tail(stderr: Path, offset: int) -> str:
    """What the failed step's srun wrote to rank 0's error log (its last 20,000 characters)."""
    try:
        size = stderr.stat().st_size
        with open(stderr, "rb") as f:
            f.seek(max(offset, size - 20000))
            return f.read(20000).decode(errors="replace")
    except OSError:
        return ""


def lost_nodes(step: list[str], allocated: list[str], srun_said: str) -> list[str]:
    """The nodes of the failed step that are lost: taken out of the allocation (SLURM resizes a
    --no-kill job when a node fails), named by srun ("Node failure on n4"), or, of the nodes srun
    heard no task of, those slurmctld flags once a ping would have found them (nodes.py)."""
    failed = srun_node_failures(srun_said)
    gone = [n for n in step if (allocated and n not in allocated) or n in failed]
    heard = srun_reporting_nodes(srun_said)
    quiet = [n for n in step if n not in heard and n not in gone]
    late = settled_losses(quiet, slurmd_timeout_s()) if quiet else []
    return [n for n in step if n in gone or n in late]


def cause(run_dir: Path, srun_said: str) -> tuple[int | None, str]:
    """(rank, what failed): the rank's own error, else srun's word of a failed node, else its
    report of the task that died."""
    first = records.first_error(run_dir, causes_only=True)
    if first is not None:
        return first.rank, first.describe()
    failed = srun_node_failures(srun_said)
    if failed:
        return None, f"srun: Node failure on {', '.join(failed)}"
    found = srun_failure(srun_said)
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


@dataclass(frozen=True)
class Next:
    """What the restart after a failed step does."""

    place: list[str]  # srun arguments that put the step on the nodes left ([]: as submitted)
    plan: str  # the step's own plan in the run directory ("": plan.json)
    change: str  # how it differs from the failed step, as restarts.jsonl and the log say it
    requeue: bool = False  # wait in the queue for the full size instead (scontrol requeue)


def next_step(
    cfg: Config, run_dir: Path, plan: dict[str, Any], alive: list[str], attempt: int, full: int
) -> Next:
    """After a loss, with `alive` nodes left of `full`: go on with them (train.elastic,
    parallel/elastic.py) under a plan for them (plan-restart{attempt}.json: plan.json stays the
    run's, which a requeued job follows at its full size), or requeue to the full size. `plan`
    is the one the failed step followed."""
    if not cfg.train.elastic:
        return Next([], "", f"requeued to wait for {full} node(s) (train.elastic=false)", requeue=True)
    r = resize(cfg, len(alive))
    change = r.describe(int(plan["world_size"]), int(plan["batch"]["global_"]), float(plan["lr"]))
    if r.derived is None:
        return Next([], "", f"requeued to wait for {full} node(s): {change}", requeue=True)
    d = r.derived
    new = dict(plan, world_size=d.world_size, nodes=r.nodes, batch=asdict(d.batch), lr=d.lr)
    new.update(layout=asdict(d.layout), notes=r.notes)
    name = f"plan-restart{attempt}.json"
    records.write_json(run_dir / name, new)
    place = [f"--nodes={r.nodes}", f"--ntasks={d.world_size}", f"--nodelist={','.join(alive)}"]
    return Next(place, name, change)


def requeue(jid: str) -> str | None:
    """Requeue this job (SLURM then ends this script); None, or why it could not."""
    from hpctrain.launch.slurm.scheduler import ask

    answer = ask(["scontrol", "requeue", jid], patience_s=60)
    return None if answer.ok else answer.why()


def main(argv: list[str]) -> int:
    folder, status = argv[0], int(argv[1])
    if status == 0:
        return 0
    env = dict(os.environ)
    jid = job_id(env)
    run_dir = run_dir_of(folder, jid)
    cfg = planned_config(run_dir)
    max_restarts = cfg.train.max_restarts
    stderr = Path(folder) / f"{jid}_0_log.err"
    started, offset, place, plan_name = _job_start(env), 0, list[str](), ""
    alive = hostnames(env.get("SLURM_JOB_NODELIST", ""))  # the first step's: the whole allocation
    while status != 0:
        # after each failed step, not only the first: a start retried after MPI's start-up
        # segfault (start_fault) runs the check again, and may fail it (a CI run did)
        if cfg.cluster.preflight.enabled and resubmitted_without_bad_nodes(cfg, run_dir):
            return status
        done = restarts.read_restarts(run_dir)
        state = job_state(jid)
        srun_said = _tail(stderr, offset)  # read once: the cause and the lost nodes both come from it
        fault = start_fault(run_dir, srun_said, done) if state in (State.RUNNING, State.UNKNOWN) else None
        why = None if fault else why_not(run_dir, max_restarts, len(restarts.counted(done)), state)
        if why is not None:
            if max_restarts:
                print(f"hpctrain: {why}", file=sys.stderr, flush=True)
            return status
        rank, what = fault or cause(run_dir, srun_said)
        lost = [] if fault else lost_nodes(alive, job_nodes(jid), srun_said)
        alive = [n for n in alive if n not in lost]
        plan = records.read_json(run_dir / records.PLAN)
        attempt = len(done) + 1
        if lost:
            followed = records.read_json(run_dir / (plan_name or records.PLAN))
            step = next_step(cfg, run_dir, followed, alive, attempt, int(plan["nodes"]))
        else:
            step = Next(place, plan_name, "")
        restart = restarts.restart_for(
            run_dir, what, rank, len(alive) + len(lost), started, lost, step.change, start=fault is not None
        )
        restarts.set_aside(run_dir)
        restarts.record(run_dir, restart)
        where = "waits in the queue" if step.requeue else "a new job step"
        print(f"hpctrain: {restart.describe()} ({where})", file=sys.stderr, flush=True)
        if step.requeue:
            failed = requeue(jid)
            if failed:
                print(f"hpctrain: the job could not be requeued: {failed}", file=sys.stderr, flush=True)
            return status
        started, place, plan_name = time.time(), step.place, step.plan
        offset = stderr.stat().st_size if stderr.exists() else 0
        env[restarts.ATTEMPT_VAR] = str(int(env.get(restarts.ATTEMPT_VAR, "0") or 0) + 1)
        if plan_name:
            env[records.PLAN_VAR] = plan_name
        if lost and place:  # the allocation shrinks (or has): srun checks these against it
            env = step_env(env, job_nodes(jid) or alive, len(alive) * int(plan["ranks_per_node"]))
        status = subprocess.call(srun_argv(plan, folder, "SLURM_ARRAY_JOB_ID" in env, place), env=env)
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
