"""The launcher interface: every way of starting ranks (local mpirun, SLURM, ...) implements it.

Modelled on TorchX's Scheduler (a pure dry run, then submit, describe, logs, cancel) and
ReFrame's launcher registry. A launcher is chosen by the config's `cluster.name`
(see registry.py); the code above it never asks which one it has.

    plan(cfg, run_dir)        pure: the launch plan (what --dry-run prints), no I/O
    describe(plans)           the dry-run text of one run or a sweep
    admit(runs)               refuse what the scheduler would not accept, before any file is written
    held(cfg, home, ...)      hold resources while runs go one after another (SLURM: one allocation)
    submit(runs)              write the run files, start or submit; returns one Job per run
    status(jobs)              JobStatus per job id (PENDING RUNNING COMPLETED FAILED CANCELLED ...)
    wait(jobs)                poll status until every job is done (generic, below)
    log_paths(job, rank)      the files holding a rank's output
    follow_paths(job)         the files where rank 0's lines and progress events appear
    cancel(jobs)              stop the jobs and every rank they started
    failure(job, status)      the error that explains a run that did not complete
"""

from __future__ import annotations

import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from hpctrain import records
from hpctrain.analysis.memory import GiB, Limit
from hpctrain.config.schema import ClusterConf, Config
from hpctrain.errors import HpctrainError, LaunchError, Problem
from hpctrain.facts import HostFacts

DONE = records.DONE  # a job is done in any of these states (records/states.py)


class Plan(Protocol):
    """What every launcher's plan has: enough to write plan.json and to start the ranks, and the
    decisions worth telling the user. Each launcher's own plan type flows through its launcher
    (Launcher[SlurmPlan], as TorchX's Scheduler[T] does), so nothing downcasts."""

    @property
    def run_dir(self) -> str: ...

    @property
    def world_size(self) -> int: ...

    @property
    def notes(self) -> list[str]: ...

    def to_dict(self) -> dict[str, Any]: ...


P = TypeVar("P", bound=Plan)


@dataclass(frozen=True)
class RunSpec(Generic[P]):
    """One run to start: its place in a sweep, its overrides, its validated config and plan."""

    index: int
    overrides: list[str]
    cfg: Config
    plan: P

    @property
    def run_dir(self) -> Path:
        """The run's directory (its plan's)."""
        return Path(self.plan.run_dir)


@dataclass(frozen=True)
class Job:
    """A started run: its directory and the reference job.json holds."""

    run_dir: Path
    ref: records.JobRef

    @property
    def job_id(self) -> str:
        """The launcher's id of the job (local: the supervisor's pid; SLURM: the job id)."""
        return self.ref.job_id

    @classmethod
    def load(cls, run_dir: Path) -> Job:
        """The job of a run directory (registry.job_launcher says which launcher it needs)."""
        return cls(run_dir, records.read(run_dir / records.JOB, records.JobRef))


@dataclass(frozen=True)
class JobStatus:
    """What the launcher knows of a job now: its state, its nodes, its elapsed time, and why it
    waits or how it ended."""

    job_id: str
    state: records.State
    nodes: int | None = None
    elapsed: str = "-"
    reason: str = ""  # why it is pending, or how it ended
    blocked: bool = False  # pending, and the scheduler says it can never start as submitted
    fix: str = ""  # what to do about a blocked job (the scheduler's reason decides)
    source: str = (
        ""  # what the state rests on when not the scheduler's usual word ("accounting unavailable ...")
    )

    @property
    def done(self) -> bool:
        """The job has ended (completed, failed or cancelled)."""
        return self.state in DONE


@dataclass(frozen=True)
class After:
    """A job this run waits for (run.after): to complete (ok), or to end in any state."""

    job: Job
    ok: bool

    @property
    def mode(self) -> str:
        """SLURM's dependency type: afterok or afterany."""
        return "afterok" if self.ok else "afterany"


class Excludes(ABC):
    """The capability of a launcher on a cluster of several nodes: submit a run again, into its
    own directory, never on the nodes named (a pre-flight check judged them bad)."""

    @abstractmethod
    def resubmit_excluding(self, spec: RunSpec[Any], hosts: list[str]) -> tuple[RunSpec[Any], Job]:
        """The run's spec with the hosts excluded (its config and plan rewritten), and its job."""


class Launcher(ABC, Generic[P]):
    """Where runs run: plans them (pure), starts or submits them, and answers status, logs and
    cancel for them. One class per launcher, chosen by `cluster=` (launch/registry.py); its
    cluster config is its `schema`. `P` is the type of its plans."""

    #: set by the registry (launch/registry.py)
    name: ClassVar[str]
    #: the cluster config this launcher reads
    schema: ClassVar[type[ClusterConf]]
    #: runs of a sweep go one after another (not at once)
    sequential: ClassVar[bool] = False
    #: ^C while waiting ends the runs (else they go on)
    cancel_on_interrupt: ClassVar[bool] = False

    def __init__(self, facts: HostFacts | None = None, python: str = sys.executable) -> None:
        self.facts = facts
        self.python = python

    def interrupt_ends_runs(self) -> bool:
        """Whether the runs end with the waiting command anyway, without cancel_on_interrupt (they
        run in what the command holds for them: held())."""
        return False

    # --- about the cluster config -----------------------------------------------------------
    @staticmethod
    def problems(cfg: Config) -> list[Problem]:
        """Rules for this launcher's cluster config (each names the key, the rule and the fix)."""
        return []

    @classmethod
    def host_facts(cls) -> HostFacts | None:
        """Facts of the machine the ranks run on, when that is this machine (else None)."""
        return None

    def on_gpus(self, cfg: Config) -> bool:
        """Whether the ranks compute on GPUs."""
        return False

    def memory_per_rank(self, cfg: Config) -> Limit | None:
        """The memory each rank has: cluster.memory_per_rank_gib where given, else what the
        launcher knows of its nodes (None: nothing says)."""
        given = cfg.cluster.memory_per_rank_gib
        if given:
            return Limit(int(given * GiB), "cluster.memory_per_rank_gib")
        return self.known_memory_per_rank(cfg)

    def known_memory_per_rank(self, cfg: Config) -> Limit | None:
        """What the launcher knows of each rank's memory on its nodes (None: nothing)."""
        return None

    # --- planning (pure) --------------------------------------------------------------------
    @abstractmethod
    def plan(self, cfg: Config, run_dir: Path, group_dir: Path | None = None) -> P:
        """The run's plan (plan.json): how it starts, with what, where; pure."""

    @abstractmethod
    def describe(self, runs: list[RunSpec[P]]) -> str:
        """What --dry-run prints for the runs: the command or the script that would start them."""

    def held_until(self, cfg: Config, after: list[After]) -> Config | None:
        """cfg with the scheduler holding its job until `after` have ended (SLURM's
        --dependency), or None where this launcher has no scheduler to do it: the command then
        waits for them before it starts the run (orchestrate/after.py)."""
        return None

    # --- side effects -----------------------------------------------------------------------
    @contextmanager
    def held(self, cfg: Config, home: Path, minutes: float, say: Callable[[str], None]) -> Iterator[None]:
        """Hold the resources of runs shaped like `cfg` for about `minutes` while the block runs,
        so that runs submitted inside it, one at a time, start at once (SLURM: one allocation,
        each run a job step of it; its records in `home`). Default: nothing to hold, local
        ranks start at once."""
        yield

    def submit_driver(self, cfg: Config, home: Path, minutes: float, command: list[str]) -> Job:
        """Submit one job of `cfg`'s shape for about `minutes` that runs `command` (hpctrain) on its
        first node; held() there finds itself inside it and starts each run as a job step of it
        (a study in one allocation with --analyze-as-job). Its records in `home`."""
        raise LaunchError(f"the {self.name} launcher has no scheduler to hold nodes for a command")

    def describe_held(self, cfg: Config, home: Path, minutes: float) -> str:
        """What held() would submit and how a run would start in it, for a dry run ("": nothing)."""
        return ""

    def admit(self, runs: list[RunSpec[P]]) -> None:
        """Refuse, before anything is written or submitted, runs the scheduler would not accept
        (e.g. more jobs than the user may queue). Raises LaunchError. Default: accept all."""
        return None

    @abstractmethod
    def submit(self, runs: list[RunSpec[P]], group_dir: Path | None = None, detach: bool = True) -> list[Job]:
        """Write each run's files, then start or submit. `detach=False`: the caller waits, and
        the runs may end with it (a local launch watches its parent)."""

    @abstractmethod
    def status(self, jobs: list[Job]) -> dict[str, JobStatus]:
        """Each job's status, by job id."""

    @abstractmethod
    def log_paths(self, job: Job, rank: int) -> list[Path]:
        """The files that hold what rank `rank` printed (`hpctrain logs --rank`)."""

    @abstractmethod
    def follow_paths(self, job: Job) -> list[Path]:
        """The files a waiting `hpctrain run` shows as they grow (rank 0's and the launcher's)."""

    @abstractmethod
    def cancel(self, jobs: list[Job]) -> None:
        """Stop the jobs and every rank of them."""

    def dependents(self, jobs: list[Job]) -> list[tuple[str, str]]:
        """This scheduler's jobs held until one of `jobs` ends (their dependency names it: hpctrain
        run --after), as (id, how: "afterok" starts only after a success, others once it ends);
        none where jobs cannot wait for jobs (a local command waits itself)."""
        return []

    def cancel_ids(self, ids: list[str]) -> None:
        """Cancel jobs by id (dependents(): jobs that need not be hpctrain's)."""
        return None

    @abstractmethod
    def failure(self, job: Job, status: JobStatus) -> HpctrainError:
        """The error a failed job ends the command with: the failed rank, its cause, its last lines."""

    def accounted(self, job: Job, summary: records.RunSummary) -> records.RunSummary:
        """The summary with what the scheduler's accounting says the run cost (node-hours,
        core-hours, energy); unchanged where there is none (the allocation's figures stay)."""
        return summary

    def release(self, jobs: list[Job]) -> None:
        """The waiting command stops waiting: the jobs must keep running after it exits (a SLURM
        job does anyway; a local run's supervisor is told not to follow its parent)."""
        return None

    def settled(self, jobs: list[Job]) -> None:
        """Every job is done: what must also have ended before wait() returns (nothing of a run
        outlives the command; a local run's supervisor, say)."""
        return None

    def started_message(self, runs: list[RunSpec[P]], jobs: list[Job]) -> str:
        """What to tell the user once the runs are started or submitted."""
        if len(jobs) == 1:
            return (
                f"[bold]started[/] {self.name} run, job {jobs[0].job_id} ({runs[0].plan.world_size} rank(s))"
            )
        return f"[bold]started[/] {len(jobs)} {self.name} runs: jobs {jobs[0].job_id} .. {jobs[-1].job_id}"

    def wait(
        self,
        jobs: list[Job],
        timeout_s: float,
        poll_s: float = 1.0,
        on_poll: Callable[[dict[str, JobStatus]], None] = lambda s: None,
    ) -> dict[str, JobStatus]:
        """Poll until every job is done (SLURM's accounting lags a job's end by a second or two)."""
        deadline = time.monotonic() + timeout_s
        while True:
            states = self.status(jobs)
            on_poll(states)
            if len(states) == len(jobs) and all(s.done for s in states.values()):
                self.settled(jobs)
                return states
            blocked = [j for j in jobs if j.job_id in states and states[j.job_id].blocked]
            if blocked:  # waiting would be for ever: stop them and say why
                self.cancel(blocked)
                first = states[blocked[0].job_id]
                why, fix = first.reason, first.fix or "change the request and submit again"
                raise LaunchError(
                    f"job(s) {', '.join(j.job_id for j in blocked)} can never start as submitted "
                    f"({why}); they were cancelled: {fix}"
                )
            if time.monotonic() > deadline:
                self.release(jobs)
                raise LaunchError(
                    f"jobs {', '.join(j.job_id for j in jobs)} not done after {timeout_s:.0f} s "
                    f"(states: {', '.join(f'{k}={v.state}' for k, v in states.items())}); "
                    "they keep running: hpctrain status / cancel"
                )
            time.sleep(poll_s)
