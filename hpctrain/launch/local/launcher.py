"""The local launcher: mpirun on this machine, through a detached supervisor process
(supervisor.py) so that local runs have the same verbs as SLURM jobs."""

from __future__ import annotations

import math
import os
import shutil
import signal
import socket
import subprocess
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from hpctrain import records
from hpctrain.analysis.memory import Limit
from hpctrain.config.schema import Config, LocalClusterConf
from hpctrain.engine.registry import needs_mpi
from hpctrain.errors import HpctrainError, LaunchError, Problem, RankFailure, RunCancelled
from hpctrain.facts import HostFacts, host_memory_bytes
from hpctrain.launch.base import Job, JobStatus, Launcher, RunSpec
from hpctrain.launch.local.plan import JobPlan, plan_local
from hpctrain.launch.local.supervisor import write_state
from hpctrain.launch.rundir import prepare_run_dir, write_run_files
from hpctrain.lifeline import stat_fields
from hpctrain.records import State

CANCEL_WAIT_S = 20.0
SUPERVISOR_EXIT_S = 10.0  # a finished run's supervisor leaves within this (it has nothing left to do)


def process_start(pid: int) -> int | None:
    """A process's start time in clock ticks (/proc/PID/stat field 22): with the pid, it tells
    our supervisor from an unrelated process that reused its pid."""
    fields = stat_fields(f"/proc/{pid}/stat")
    if fields is None or fields[0] in (
        "Z",
        "X",
    ):  # exited, not yet reaped by its parent (the waiting hpctrain)
        return None
    return int(fields[19])


def supervisor_alive(ref: records.JobRef) -> bool | None:
    """True/False for a supervisor on this host; None when it runs elsewhere (cannot tell)."""
    if ref.pid is None:
        return False
    if ref.host not in (None, socket.gethostname()):
        return None
    return process_start(ref.pid) == ref.pid_start


class LocalLauncher(Launcher[JobPlan]):
    schema = LocalClusterConf
    sequential = True
    cancel_on_interrupt = True

    @staticmethod
    def problems(cfg: Config) -> list[Problem]:
        from hpctrain.config.validate import at_least

        c: LocalClusterConf = cfg.cluster
        p = at_least("cluster.ranks", c.ranks, 1) + at_least(
            "cluster.threads_per_rank", c.threads_per_rank, 1
        )
        if not c.mpirun.strip():
            p.append(Problem("cluster.mpirun", "is empty", "set cluster.mpirun=mpirun (or a full path)"))
        if cfg.debug.hold_step is not None:
            p.append(
                Problem(
                    "debug.hold_step",
                    "holds a SLURM run until its requeue signal; a local run gets none and would never hold",
                    "use it with cluster=slurm, or drop it",
                )
            )
        if c.starter == "spawn" and cfg.script.path and cfg.parallelism.backend == "mpi":
            p.append(  # auto spawns a script where no mpirun is found; an explicit spawn says more
                Problem(
                    "cluster.starter",
                    "spawn starts the ranks without MPI, and parallelism.backend=mpi starts a script's "
                    "ranks under MPI (Horovod over MPI needs it): one of them would be ignored",
                    "set parallelism.backend=gloo (a torch.distributed script, or Horovod over Gloo), "
                    "or cluster.starter=mpirun",
                )
            )
        elif c.starter == "spawn" and needs_mpi(cfg):
            p.append(
                Problem(
                    "cluster.starter",
                    "spawn starts the ranks without MPI, and "
                    + ("the allreduce benchmark" if cfg.bench.allreduce else "Horovod over MPI")
                    + " needs it",
                    "set cluster.starter=mpirun (or auto), or parallelism.backend=gloo / engine=ddp",
                )
            )
        return p

    @classmethod
    def host_facts(cls) -> HostFacts:
        return HostFacts.gather()

    def on_gpus(self, cfg: Config) -> bool:
        return self._facts().on_gpus(str(cfg.train.device))

    def known_memory_per_rank(self, cfg: Config) -> Limit | None:
        f = self._facts()
        if self.on_gpus(cfg):
            return Limit(f.cuda_memory_bytes, "the GPU's memory") if f.cuda_memory_bytes else None
        # the ranks share this machine with everything else on it: shown, not enforced
        ranks, total = int(cfg.cluster.world_size), host_memory_bytes()
        return (
            Limit(total // ranks, f"this machine's memory / {ranks} ranks", checked=False) if total else None
        )

    def _facts(self) -> HostFacts:
        if self.facts is None:
            self.facts = HostFacts.gather()
        return self.facts

    def plan(self, cfg: Config, run_dir: Path, group_dir: Path | None = None) -> JobPlan:
        home = str(group_dir) if group_dir is not None else None
        return plan_local(cfg, self._facts(), str(run_dir), self.python, home=home)

    def describe(self, runs: list[RunSpec[JobPlan]]) -> str:
        if len(runs) == 1:
            plan: Any = runs[0].plan
            notes = "".join(f"# note: {n}\n" for n in plan.notes)
            return f"{notes}# launch command\n{plan.command_line}\n"
        return "".join(f"# {r.index}: {' '.join(r.overrides)}\n" for r in runs)

    def submit(
        self, runs: list[RunSpec[JobPlan]], group_dir: Path | None = None, detach: bool = True
    ) -> list[Job]:
        mpirun = runs[0].plan.argv[0]
        if shutil.which(mpirun) is None:
            raise LaunchError(
                f"cannot start {mpirun!r}: not found; install OpenMPI "
                "(apt-get install openmpi-bin) or set cluster.mpirun"
            )
        with records.one_sync():
            for r in runs:
                write_run_files(prepare_run_dir(r.run_dir), r.cfg, r.plan)
                write_state(r.run_dir, State.PENDING)
        home = group_dir or runs[0].run_dir
        home.mkdir(parents=True, exist_ok=True)
        argv = [self.python, "-m", "hpctrain.launch.local.supervisor"]
        if not detach:
            argv += ["--parent", str(os.getpid())]
        argv += [str(r.run_dir) for r in runs]
        with open(home / records.SUPERVISOR_LOG, "ab") as log:
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )  # its own process group: cancel ends it all
        start = process_start(proc.pid)
        jobs = []
        for r in runs:
            job_id = str(proc.pid) if len(runs) == 1 else f"{proc.pid}_{r.index}"
            ref = records.new(
                records.JobRef,
                launcher=self.name,
                job_id=job_id,
                world_size=r.plan.world_size,
                pid=proc.pid,
                pid_start=start,
                host=socket.gethostname(),
            )
            records.write(r.run_dir / records.JOB, ref)
            jobs.append(Job(r.run_dir, ref))
        return jobs

    def settled(self, jobs: list[Job]) -> None:
        """The outcome recorded, until each supervisor has left too (it writes state.json before
        it exits)."""
        deadline = time.monotonic() + SUPERVISOR_EXIT_S
        while any(supervisor_alive(j.ref) for j in jobs) and time.monotonic() < deadline:
            time.sleep(0.02)

    def status(self, jobs: list[Job]) -> dict[str, JobStatus]:
        out = {}
        for job in jobs:
            try:
                st = records.read(job.run_dir / records.STATE, records.LocalState)
            except records.RecordMissing:
                st = None
            state = State.of(st.state) if st else State.PENDING
            reason = ""
            if state in (State.PENDING, State.RUNNING) and supervisor_alive(job.ref) is False:
                # read again: the supervisor may have finished between the two looks
                st = records.read(job.run_dir / records.STATE, records.LocalState)
                if st.state in (State.PENDING, State.RUNNING):
                    state, reason = State.FAILED, self._supervisor_gone(job, st.updated)
                    st = records.read(job.run_dir / records.STATE, records.LocalState)
                else:
                    state = State.of(st.state)
            elapsed = "-"
            if st is not None and st.started is not None:
                end = st.updated if state not in (State.PENDING, State.RUNNING) else time.time()
                elapsed = elapsed_text(end - st.started)
            out[job.job_id] = JobStatus(job.job_id, state, nodes=1, elapsed=elapsed, reason=reason)
        return out

    @staticmethod
    def _supervisor_gone(job: Job, updated: float) -> str:
        """The supervisor ended without recording an outcome (it was killed): record it, so that
        state.json, status and the final message agree, as of the run's last sign of life (its
        state, its launcher log, rank 0's steps: a restart rewrites the state at its start).
        Its mpirun and ranks ended with it (lifelines)."""
        reason = (
            f"the local supervisor (pid {job.ref.pid}) was killed before it recorded an outcome; "
            "its mpirun and ranks were stopped with it"
        )
        at = max([updated, *_mtimes(job.run_dir / records.LAUNCHER_LOG, job.run_dir / records.steps_file(0))])
        write_state(job.run_dir, State.FAILED, at=min(at, time.time()), failure=records.Failure(None, reason))
        return reason

    def log_paths(self, job: Job, rank: int) -> list[Path]:
        return [job.run_dir / records.log_file(rank)]

    def follow_paths(self, job: Job) -> list[Path]:
        return [job.run_dir / records.LAUNCHER_LOG, job.run_dir / records.log_file(0)]

    def cancel(self, jobs: list[Job]) -> None:
        """SIGTERM to each supervisor (it stops mpirun and the ranks and records CANCELLED); SIGKILL
        to its whole process group if it has not ended after CANCEL_WAIT_S."""
        by_pid: dict[int, list[Job]] = defaultdict(list)
        for job in jobs:
            if job.ref.pid is not None:
                by_pid[job.ref.pid].append(job)
        for pid, group in by_pid.items():
            if supervisor_alive(group[0].ref) is None:
                raise LaunchError(
                    f"run {group[0].run_dir} was started on {group[0].ref.host}: cancel it there"
                )
            if supervisor_alive(group[0].ref):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + CANCEL_WAIT_S
        for pid, group in by_pid.items():
            while supervisor_alive(group[0].ref) and time.monotonic() < deadline:
                time.sleep(0.1)
            if supervisor_alive(group[0].ref):
                os.killpg(pid, signal.SIGKILL)
            for job in group:  # a supervisor killed before it could write says nothing more
                st = records.read(job.run_dir / records.STATE, records.LocalState)
                if st.state in (State.PENDING, State.RUNNING):
                    write_state(job.run_dir, State.CANCELLED)

    def release(self, jobs: list[Job]) -> None:
        """A marker in each run directory: the supervisor, seeing its parent gone, finds it and
        keeps going (a file, not a signal: it is there before the parent exits, whatever the order)."""
        for job in jobs:
            (job.run_dir / records.RELEASED).touch()

    def failure(self, job: Job, status: JobStatus) -> HpctrainError:
        st = records.read(job.run_dir / records.STATE, records.LocalState)
        if st.launch_error:
            return LaunchError(st.launch_error)
        if status.state == State.CANCELLED:
            never = " before it started" if st.started is None else ""  # queued behind a stopped run
            return RunCancelled(f"run {job.run_dir} was cancelled{never}")
        if st.failure is not None:
            return RankFailure(st.failure.rank, st.failure.cause, st.failure.tail, str(job.run_dir))
        return RankFailure(None, status.reason or f"the run ended {status.state}", run_dir=str(job.run_dir))


def _mtimes(*paths: Path) -> list[float]:
    """When each of `paths` that exists was last written."""
    out = []
    for p in paths:
        try:
            out.append(p.stat().st_mtime)
        except OSError:
            continue
    return out


def elapsed_text(seconds: float) -> str:
    """A run's time as squeue shows a job's ([D-]HH:MM:SS, a clock skew clamped to 0); "-" for
    one no run can have taken (a damaged state.json: not finite, or over a century)."""
    if not math.isfinite(seconds) or seconds > 100 * 365 * 86400:
        return "-"
    minutes, secs = divmod(int(max(seconds, 0.0)), 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    return (f"{days}-" if days else "") + f"{hours:02d}:{minutes:02d}:{secs:02d}"
