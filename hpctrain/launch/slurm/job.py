"""What every SLURM task runs: submitit unpickles a TrainingJob and calls it, once per rank.

Requeue follows submitit's checkpoint protocol, made safe for synchronous data parallelism: the
SIGUSR2 that SLURM sends before the time limit (or `scancel -s USR2`) only sets a flag; all ranks
agree on it at the next step boundary, rank 0 writes a checkpoint atomically, and only then does
rank 0 hand over to submitit's own handler, which calls `checkpoint()` and requeues the job. The
requeued job resumes every rank from that checkpoint at the same step.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import submitit
from submitit.core.utils import DelayedSubmission, UncompletedJobError

from hpctrain import heap, records
from hpctrain.config.run_file import planned_config
from hpctrain.errors import RecordError


class NotRequeued(RuntimeError):
    """The job stopped at its time limit with a checkpoint, and submitit did not requeue it."""


def plan_needs(run_dir: Path, cfg: Any) -> records.RankNeeds:
    """What the plan says the ranks need; a plan written before it said so (or none to read: the
    rank's own start says why): asked of the config."""
    try:
        plan = records.read(records.plan_file(run_dir, os.environ), records.PlanRecord)
        if plan.needs is not None:
            return plan.needs
    except RecordError:
        pass
    from hpctrain.engine.registry import needs_gloo_rendezvous

    return records.RankNeeds(gloo_rendezvous=needs_gloo_rendezvous(cfg))


def _not_requeued(run_dir: Path, max_requeues: int, why: BaseException) -> str:
    from hpctrain.train import checkpoint

    ckpt = checkpoint.latest(run_dir)
    where = f"{ckpt.name} holds the state to resume from" if ckpt else "no checkpoint was written"
    return (
        f"stopped at the time limit and not requeued: {why} (cluster.max_requeues={max_requeues}); "
        f"{where}; raise cluster.time_min or cluster.max_requeues"
    )


class TrainingJob(submitit.helpers.Checkpointable):
    def __init__(self, run_dir: str) -> None:
        self.run_dir = run_dir

    def __call__(self) -> bool:
        from hpctrain.api import request_stop
        from hpctrain.engine.horovod import slurm_gloo_setup
        from hpctrain.lifeline import die_with_parent, guard_group
        from hpctrain.rank import fail, run
        from hpctrain.train.stop import StopControl

        run_dir = Path(self.run_dir)
        heap.hold()  # until the trainer is built (hpctrain/heap.py)
        guard_group()  # what this rank starts ends with it, however it ends
        if os.environ.get(REQUEUE_DIR_VAR):
            # in an image, the task is the host's wrapper around this rank (container/plan.py):
            # when SLURM ends the task, this rank, which ignores SIGTERM under submitit, must not
            # live on as an orphan outside the step
            die_with_parent(signal.SIGKILL)
        try:
            cfg = planned_config(run_dir)
            control = StopControl(checkpoint_interval=cfg.cluster.checkpoint_interval)  # a SLURM config
            submitit_handler = signal.getsignal(signal.SIGUSR2)

            def stop(*_: object) -> None:  # the built-in loop and hpctrain.api both see it
                control.requested = True
                request_stop()

            signal.signal(signal.SIGUSR2, stop)
            if plan_needs(run_dir, cfg).gloo_rendezvous:
                slurm_gloo_setup(run_dir)
            finished = run(run_dir, control)
        except BaseException as e:  # noqa: BLE001 - record it and end this task now
            fail(run_dir, e)
        if finished:
            atexit.register(leave_without_teardown)  # runs first: submitit's result is written by then
            return True
        # Stopped after a checkpoint: rank 0 lets submitit requeue the job (it exits the process).
        if int(os.environ.get("SLURM_PROCID", "0")) == 0 and callable(submitit_handler):
            requeue_through_host()
            try:
                submitit_handler(signal.SIGUSR2, None)
            except UncompletedJobError as e:  # submitit will not requeue: max_requeues time-outs used
                fail(run_dir, NotRequeued(_not_requeued(run_dir, cfg.cluster.max_requeues, e)))
        time.sleep(300)  # the requeue ends this task
        os._exit(0)

    def checkpoint(self, *args: Any, **kwargs: Any) -> DelayedSubmission:
        """submitit's protocol: what to run after the requeue. The run directory holds the
        checkpoint, so the same job resumes from it."""
        return DelayedSubmission(TrainingJob(self.run_dir))


def leave_without_teardown() -> None:
    """The task's last act, once submitit has pickled the result and returned: finalize MPI as a
    local rank does (rank.py), then leave without the interpreter's teardown. There a torch
    process group's worker thread can be destroyed while still running ("terminate called without
    an active exception", SIGABRT: seen on a loaded machine as a DDP rank killed after its last
    step, about 1 run in 10), which SLURM reports as a failed job."""
    from hpctrain.engine.world import finalize_mpi

    try:
        finalize_mpi()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


class ArrayTask(submitit.helpers.Checkpointable):
    """Every task of a job array: one pickle holds the array's run directories (launch/slurm/
    submit.py) and each task trains the one at its SLURM_ARRAY_TASK_ID. A requeued task's
    checkpoint is its own TrainingJob, pickled under its own name."""

    def __init__(self, run_dirs: list[str]) -> None:
        self.run_dirs = run_dirs

    def mine(self) -> TrainingJob:
        return TrainingJob(self.run_dirs[int(os.environ["SLURM_ARRAY_TASK_ID"])])

    def __call__(self) -> bool:
        return self.mine()()

    def checkpoint(self, *args: Any, **kwargs: Any) -> DelayedSubmission:
        return self.mine().checkpoint(*args, **kwargs)


REQUEUE_DIR_VAR = "HPCTRAIN_REQUEUE_DIR"  # set by the plan when the task runs in a container


def requeue_through_host() -> None:
    """In a container there is no `scontrol`: submitit's requeue becomes a request file, which
    the task's wrapper on the host hands to scontrol once the container exits (see
    launch/container/plan.py, HOST_REQUEUE)."""
    folder = os.environ.get(REQUEUE_DIR_VAR)
    if not folder:
        return
    from submitit.core import logger
    from submitit.slurm.slurm import SlurmJobEnvironment

    def request(env: SlurmJobEnvironment, countdown: int) -> None:
        job = os.environ.get("SLURM_JOB_ID", "")
        records.write_atomic(Path(folder) / f"requeue-{job}", env.job_id)
        logger.get_logger().info(
            f"Requeue of job {env.job_id} asked of the host ({countdown} remaining timeouts)"
        )

    setattr(SlurmJobEnvironment, "_requeue", request)  # noqa: B010 - replaces a method for this process
