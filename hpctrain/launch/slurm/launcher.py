"""The SLURM launcher: submitit writes the sbatch script, srun starts one task per rank, sacct
tells the state. Sweeps and studies go out as one job array per resource shape."""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from hpctrain import bounded, records
from hpctrain.analysis.memory import GiB, Limit
from hpctrain.config.schema import Config, SlurmClusterConf
from hpctrain.errors import ConfigError, HpctrainError, LaunchError, Problem, RankFailure, RunCancelled
from hpctrain.facts import HostFacts
from hpctrain.launch.base import After, Excludes, Job, JobStatus, Launcher, RunSpec
from hpctrain.launch.output import srun_failure
from hpctrain.launch.slurm.limits import SLURM_DEFAULT_MAX_ARRAY_SIZE, Limits, ranges_text, read_limits
from hpctrain.launch.slurm.plan import SlurmPlan, plan_slurm
from hpctrain.launch.slurm.sacct import ENDED, blocked_fix, explain_pending, job_usage
from hpctrain.launch.slurm.scheduler import MISSING, ask, configure, keep_under, query
from hpctrain.launch.slurm.watcher import StatusWatcher
from hpctrain.records import State

if TYPE_CHECKING:
    from hpctrain.launch.slurm.allocation import Allocation

HOLD_WAIT_S = 24 * 3600.0  # how long held() waits in the queue for its allocation
SINFO_NODES = [
    "sinfo",
    "-h",
    "-N",
    "-o",
    "%N|%P|%c|%s",
]  # every node, its partitions, CPUs, job sizes: admit's check


class SlurmLauncher(Launcher[SlurmPlan], Excludes):
    schema = SlurmClusterConf
    _limits: Limits | None = None

    def __init__(self, facts: HostFacts | None = None, python: str = sys.executable) -> None:
        super().__init__(facts, python)
        self.watcher = StatusWatcher()  # every status question of this launcher goes through it
        self.allocation: Allocation | None = None  # held(): runs start as its steps
        self._asking: threading.Thread | None = None
        self._nodes: str | None = None  # sinfo's answer, read beside a sweep's planning
        self._sinfo: threading.Thread | None = None

    @staticmethod
    def problems(cfg: Config) -> list[Problem]:
        from hpctrain.launch.slurm.rules import slurm_problems

        return slurm_problems(cfg, cfg.cluster)

    def on_gpus(self, cfg: Config) -> bool:
        return cfg.cluster.gpus_per_node > 0 and str(cfg.train.device) != "cpu"

    def known_memory_per_rank(self, cfg: Config) -> Limit | None:
        c = cfg.cluster
        if self.on_gpus(cfg) or not c.mem_gb:  # the nodes' GPUs are not known from here
            return None
        return Limit(
            int(c.mem_gb * GiB / c.ranks_per_node),
            "cluster.mem_gb / cluster.ranks_per_node",
            "cluster.mem_gb",
        )

    def plan(self, cfg: Config, run_dir: Path, group_dir: Path | None = None) -> SlurmPlan:
        folder = str(group_dir / "submitit") if group_dir is not None else None
        configure(cfg.cluster.queries_per_min)  # this command's rate of SLURM commands
        if group_dir is not None and self._limits is None and self._asking is None:
            # a sweep needs the scheduler's limits before it submits: asked now, beside the planning
            self._asking = threading.Thread(target=self._read_limits, args=(cfg.cluster.qos,), name="limits")
            self._asking.start()
            self._sinfo = threading.Thread(target=self._read_nodes, name="nodes")  # admit's, at once
            self._sinfo.start()
        return plan_slurm(cfg, str(run_dir), self.python, folder)

    def _read_limits(self, qos: str | None) -> Limits:
        limits = self._limits = read_limits(qos)
        keep_under(limits.rpc_per_min)
        return limits

    def _read_nodes(self) -> None:
        self._nodes = query(SINFO_NODES)  # what admit holds the nodes asked for against

    def _node_table(self) -> str | None:
        """sinfo's nodes and partitions: read beside the planning for a sweep, else now."""
        if self._sinfo is not None:
            self._sinfo.join()
            self._sinfo = None
            return self._nodes
        self._read_nodes()
        return self._nodes

    def limits(self, runs: list[RunSpec[SlurmPlan]]) -> Limits:
        """The scheduler's limits (read once per launcher)."""
        if self._asking is not None:
            self._asking.join()
            self._asking = None
        return self._limits if self._limits is not None else self._read_limits(runs[0].cfg.cluster.qos)

    def describe(self, runs: list[RunSpec[SlurmPlan]]) -> str:
        from hpctrain.launch.slurm.submit import group_by_shape

        if len(runs) == 1:
            notes = "".join(f"# note: {n}\n" for n in runs[0].plan.notes)
            script = runs[0].plan.sbatch_script()
            return f"{notes}# sbatch script (submitted by submitit; nothing was submitted)\n{script}"
        limits = self.limits(runs)
        out = [f"# arrays of at most {limits.max_array_size} runs ({limits.source})"]
        for group in group_by_shape(runs):
            parts = limits.arrays(len(group))
            for k, part in enumerate(parts):
                indices = ranges_text([group[i].index for i in part])
                head = (
                    f"# array {k + 1}/{len(parts)} of this shape: {len(part)} run(s), sweep points {indices}"
                )
                script = group[0].plan.sbatch_script(array_size=len(part))
                out.append(
                    head
                    + "\n"
                    + (script if k == 0 else f"(the same script with --array=0-{len(part) - 1})\n")
                )
        return "\n".join(out)

    def admit(self, runs: list[RunSpec[SlurmPlan]]) -> None:
        """Before anything is written: the user's submit limit (a sweep), and the nodes asked
        for against the cluster's (sinfo: one call; no answer, no check)."""
        from hpctrain.launch.slurm.nodes import node_problems, partitions
        from hpctrain.launch.slurm.submit import check_room

        table = partitions(self._node_table() or "")
        if len(runs) > 1:
            check_room(runs, self.limits(runs))
        found = {str(p): p for r in runs for p in node_problems(r.cfg.cluster, table)}
        if found:
            raise ConfigError(list(found.values()))

    @contextmanager
    def held(self, cfg: Config, home: Path, minutes: float, say: Callable[[str], None]) -> Iterator[None]:
        """One allocation of the runs' shape (allocation.py) for `minutes` plus one run's
        cluster.time_min; submit() starts each run as a step of it until the block ends."""
        from hpctrain.launch.slurm.allocation import hold, inside

        here = inside(home, dict(os.environ))
        if here is not None:  # this process drives the runs from inside the allocation: it ends with it
            say(f"inside allocation {here.job_id}: every run is a job step of it")
            self.allocation = here
            try:
                yield
            finally:
                self.allocation = None
            return
        alloc = hold(self.plan(cfg, home), home, *_hold_terms(cfg, minutes), say, HOLD_WAIT_S)
        self.allocation = alloc
        try:
            yield
        finally:
            self.allocation = None
            alloc.release()

    def interrupt_ends_runs(self) -> bool:
        return self.allocation is not None  # steps of an allocation held() releases as it ends

    def submit_driver(self, cfg: Config, home: Path, minutes: float, command: list[str]) -> Job:
        from hpctrain.launch.slurm.allocation import submit_driver

        return submit_driver(self.plan(cfg, home), home, *_hold_terms(cfg, minutes), command)

    def describe_held(self, cfg: Config, home: Path, minutes: float) -> str:
        from hpctrain.launch.slurm.allocation import RELEASE, hold_script, step_command

        script = hold_script(self.plan(cfg, home).executor, *_hold_terms(cfg, minutes), home / RELEASE)
        trial = self.plan(cfg, home.parent / "trial-0")
        return (
            f"# the allocation every trial runs in (sbatch; nothing was submitted)\n{script}"
            f"# then each trial, a job step of it (trial-0's; ALLOC: the allocation's job id)\n"
            f"{step_command(trial, 'ALLOC', 'hpctrain-trial-0')}\n"
        )

    def submit(
        self, runs: list[RunSpec[SlurmPlan]], group_dir: Path | None = None, detach: bool = True
    ) -> list[Job]:
        from hpctrain.launch.slurm.submit import submit_runs

        if self.allocation is not None:  # a run at a time, as a step of the held allocation
            return [self.allocation.start(run) for run in runs]

        limits = self.limits(runs) if len(runs) > 1 else Limits(SLURM_DEFAULT_MAX_ARRAY_SIZE, None, 0, "")
        return submit_runs(runs, limits)[0]

    def held_until(self, cfg: Config, after: list[After]) -> Config | None:
        """sbatch --dependency=afterok:ID,afterany:ID: SLURM holds the job; only SLURM jobs of
        this cluster can be waited for so. Nothing to wait for: cfg as it is."""
        if not after:
            return cfg
        others = sorted({a.job.ref.launcher for a in after} - {self.name})
        if others:
            raise ConfigError.one(
                "run.after",
                f"a SLURM job can only wait for SLURM jobs; {', '.join(others)} runs are not jobs SLURM knows",
                "run the earlier runs on SLURM too, or wait for them before submitting",
            )
        # afterok:1:2,afterany:3 - sbatch(1) --dependency: a comma means all must be satisfied
        groups: dict[str, list[str]] = {}
        for a in after:
            groups.setdefault(a.mode, []).append(a.job.job_id)
        dependency = ",".join(f"{mode}:{':'.join(ids)}" for mode, ids in groups.items())
        return dataclasses.replace(cfg, cluster=dataclasses.replace(cfg.cluster, dependency=dependency))

    def resubmit_excluding(
        self, spec: RunSpec[SlurmPlan], hosts: list[str]
    ) -> tuple[RunSpec[SlurmPlan], Job]:
        """The same run, into its own directory, with `hosts` in cluster.exclude (and out of
        cluster.nodelist): its config.yaml and plan.json rewritten, its job.json the new job's.
        The failed job's error files are kept as error-rank{R}.json.N."""
        import copy

        from hpctrain.launch.rundir import write_run_files
        from hpctrain.launch.slurm.submit import submit_groups
        from hpctrain.records.restarts import set_aside

        cfg = copy.deepcopy(spec.cfg)
        c: SlurmClusterConf = cfg.cluster
        c.exclude = list(dict.fromkeys([*c.exclude, *hosts]))
        c.nodelist = [n for n in c.nodelist if n not in hosts]
        plan = self.plan(cfg, spec.run_dir)
        new = RunSpec(spec.index, [*spec.overrides, f"cluster.exclude=[{','.join(c.exclude)}]"], cfg, plan)
        set_aside(spec.run_dir)
        with records.one_sync():
            write_run_files(spec.run_dir, cfg, plan)
        jobs: list[Job] = []
        with records.one_sync():
            submit_groups([new], [[new]], Limits(SLURM_DEFAULT_MAX_ARRAY_SIZE, None, 0, ""), jobs, [])
        return new, jobs[0]

    def started_message(self, runs: list[RunSpec[SlurmPlan]], jobs: list[Job]) -> str:
        if len(jobs) == 1:
            plan = runs[0].plan
            return (
                f"[bold]submitted[/] job {jobs[0].job_id} ({plan.nodes} node(s) x {plan.ranks_per_node} "
                "rank(s))"
            )
        arrays = sorted({j.job_id.split("_")[0] for j in jobs})
        return f"[bold]submitted[/] {len(jobs)} runs as {len(arrays)} job array(s): {', '.join(arrays)}"

    def status(self, jobs: list[Job]) -> dict[str, JobStatus]:
        out = {}
        states = self.watcher.states([j.job_id for j in jobs])
        by_id = {j.job_id: j for j in jobs}
        for k, s in states.items():
            why = s.reason  # a pending job's is the controller's (squeue): accounting lags
            if s.state == ENDED:  # accounting is down: the run's records say whether it completed
                done = (by_id[k].run_dir / records.SUMMARY).exists()
                note = s.note + (
                    "; its summary.json says it completed"
                    if done
                    else "; it left the queue without a summary.json"
                )
                out[k] = JobStatus(
                    k, State.COMPLETED if done else ENDED, s.nodes, s.elapsed, note, source=note
                )
            elif s.state == State.PENDING and why:
                reason, never = explain_pending(why)
                note = f"pending: {reason}" + (f"; {s.note}" if s.note else "")
                fix = blocked_fix(why) if never else ""
                out[k] = JobStatus(k, s.state, s.nodes, s.elapsed, note, blocked=never, fix=fix)
            else:
                ended = f"exit code {s.exit_code}" if s.done else ""  # a running job has none yet
                out[k] = JobStatus(k, s.state, s.nodes, s.elapsed, s.note or ended, source=s.note)
        return out

    def log_paths(self, job: Job, rank: int) -> list[Path]:
        folder = Path(job.ref.folder or job.run_dir / "submitit")
        return [folder / f"{job.job_id}_{rank}_log.out", folder / f"{job.job_id}_{rank}_log.err"]

    def follow_paths(self, job: Job) -> list[Path]:
        return self.log_paths(job, 0)[:1]

    def cancel(self, jobs: list[Job]) -> None:
        self.cancel_ids([j.job_id for j in jobs])

    def dependents(self, jobs: list[Job]) -> list[tuple[str, str]]:
        """Pending jobs whose --dependency names one of `jobs` (or the array it belongs to), with
        how they wait on it (afterok: never after a cancel; afterany: once it ends)."""
        text = query(["squeue", "-h", "-t", State.PENDING.value, "-o", "%i|%E"])
        return waiting_on(text or "", {j.job_id for j in jobs})

    def cancel_ids(self, ids: list[str]) -> None:
        if not ids:
            return
        answer = ask(["scancel", *ids], patience_s=60)
        if answer.code == MISSING:
            raise LaunchError("scancel not found: install slurm-client")
        if not answer.ok and not ended_meanwhile(answer.err):
            raise LaunchError(f"scancel failed: {answer.why()}")

    def accounted(self, job: Job, summary: records.RunSummary) -> records.RunSummary:
        usage = job_usage(job.job_id)
        if usage is None:
            return summary
        return dataclasses.replace(
            summary,
            node_hours=usage.node_hours,
            core_hours=usage.core_hours,
            energy_j=usage.energy_j,
            cost_source="sacct",
        )

    def failure(self, job: Job, status: JobStatus) -> HpctrainError:
        """Cancelled first (ranks stopped by scancel may leave errors that are its effect), then
        the rank's own error file, then srun's report of the task that died (signal, exit code)."""
        if status.state == State.CANCELLED:
            return RunCancelled(f"job {job.job_id} was cancelled (run directory {job.run_dir})")
        first = records.first_error(job.run_dir, causes_only=True)
        if first is not None:
            return RankFailure(
                first.rank, f"{first.describe()}; job {job.job_id} {status.state}", run_dir=str(job.run_dir)
            )
        found = srun_failure(self._job_stderr(job))
        if found is not None:
            rank, cause = found
            return RankFailure(rank, f"{cause}; job {job.job_id} {status.state}", run_dir=str(job.run_dir))
        first = records.first_error(job.run_dir)  # only peers' "a rank vanished": still the best word
        if first is not None:
            return RankFailure(
                first.rank, f"{first.describe()}; job {job.job_id} {status.state}", run_dir=str(job.run_dir)
            )
        return RankFailure(
            None, f"job {job.job_id} ended {status.state} ({status.reason})", run_dir=str(job.run_dir)
        )

    def _job_stderr(self, job: Job) -> str:
        """The batch script's stderr, where srun reports tasks that failed (for a job step,
        srun's own file beside the logs: allocation.py)."""
        from hpctrain.launch.slurm.allocation import STEP_ERR

        text, stderr = "", self.log_paths(job, 0)[1]
        for path in (stderr, stderr.with_name(STEP_ERR)):
            try:
                text += bounded.tail(path, 20000)
            except OSError:
                pass
        return text


def _hold_terms(cfg: Config, minutes: float) -> tuple[str, int]:
    """The allocation's job name and time limit: `minutes` plus one run's cluster.time_min (a
    run started just before `minutes` are up may take that long)."""
    c: SlurmClusterConf = cfg.cluster
    return f"{cfg.run.name}-alloc", math.ceil(minutes) + c.time_min


# scancel(1)'s words for a job or step that ended (and left the controller) between the status
# hpctrain read and the cancel: a step of a study's allocation that finished a moment before
GONE = ("Invalid job id specified", "Job/step already completing or completed", "Job has already finished")


def ended_meanwhile(err: str) -> bool:
    """Whether every error scancel printed says only that a job had already ended (it still
    cancelled the others it was given). Pure."""
    lines = [ln for ln in err.splitlines() if ln.strip()]
    return bool(lines) and all(any(g in ln for g in GONE) for ln in lines)


def waiting_on(squeue: str, ids: set[str]) -> list[tuple[str, str]]:
    """From `squeue -o "%i|%E"` lines (job id, dependency list such as
    afterok:123_0(unfulfilled),afterany:124(unfulfilled)): the jobs that wait on one of `ids` or on
    the array one of them belongs to, each with how it waits (afterok, afterany, ...). Pure."""
    arrays = {i.split("_")[0] for i in ids}
    out = []
    for line in squeue.splitlines():
        job, _, deps = line.partition("|")
        kinds = [
            kind
            for item in deps.replace("?", ",").split(",")
            for kind, *named in [item.split(":")]
            if {dep.split("(")[0] for dep in named} & (ids | arrays)
        ]
        if kinds:
            out.append((job.strip(), kinds[0]))
    return out
