"""A study that needs no waiting terminal (`hpctrain study ... --analyze-as-job`): its points and
allreduce benchmarks are submitted at once, and its analysis as one more job, started after every
one of them has ended however it ended. Where the launcher has a scheduler that job is held by it
(SLURM's --dependency=afterany); a launcher that runs its submission one run after another (the
local supervisor) runs the analysis last. The analysis job is an ordinary one-rank run of
hpctrain's report script in <study>/analysis: status, logs and cancel work on it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hpctrain import records
from hpctrain.config.schema import CodeConf, Config, RunConf, ScriptConf
from hpctrain.errors import LaunchError, RecordError
from hpctrain.launch.base import After, Job, Launcher, RunSpec
from hpctrain.orchestrate.probe import allreduce_config, allreduce_overrides
from hpctrain.orchestrate.runs import Reporter, accounted, statuses
from hpctrain.orchestrate.started import jobs_in, launcher_of
from hpctrain.orchestrate.study_run import (
    Attempt,
    allocation_terms,
    keep_aside,
    one_allocation,
    plan_attempt,
    record_attempt,
    study_lock,
)
from hpctrain.orchestrate.validate import validate_points
from hpctrain.records import State


@dataclass(frozen=True)
class Submitted:
    """What --analyze-as-job submitted: the points' jobs, the benchmarks' and the analysis job
    (study.one_allocation: no points' jobs yet, and the analysis job is the one that holds the
    nodes and starts every point as a step of itself, then analyzes)."""

    runs: list[Job]
    benchmarks: list[Job]
    analysis: Job
    drives: bool = False


def _driven(a: Attempt) -> Submitted:
    """study.one_allocation with --analyze-as-job: one job of the largest point's shape whose
    first node runs `hpctrain study resume` on the study, which finds itself inside the job
    (Launcher.held) and starts every point as a step of it, then writes the report."""
    biggest, minutes = allocation_terms(a)
    # hpctrain on the host, as it runs here: the plan's interpreter may be one inside a container
    command = [
        a.launcher.python,
        "-m",
        "hpctrain.cli",
        "study",
        "resume",
        str(a.study_dir),
        "--no-progress",
    ]
    job = a.launcher.submit_driver(biggest.cfg, a.study_dir / records.ALLOCATION, minutes, command)
    return Submitted([], [], job, drives=True)


def analysis_config(cfg: Config, study_dir: Path, script: Path) -> Config:
    """The analysis job's config: `script` on one rank of the study's cluster (its partition,
    account, time limit, container, ...), reading `study_dir`; everything else hpctrain's
    defaults (the study's model and parallelism are its points', not this job's)."""
    return Config(
        cluster=cfg.cluster.one_rank(),
        run=RunConf(name=f"{cfg.run.name}-analysis"),  # SLURM's job name
        # hpctrain's own script, run from the installed package, in the study directory
        code=CodeConf(dir=str(study_dir), snapshot=False),
        # the analysis prints once, at the end; it is not a stall however long it takes
        script=ScriptConf(path=str(script), args=[str(study_dir)], stall_timeout_s=0.0),
    )


def _benchmark_specs(a: Attempt) -> list[RunSpec]:
    out = []
    for i, (n, cfg) in enumerate(a.benchmarks(), start=len(a.runs)):
        bench = allreduce_config(cfg, a.manifest.allreduce_max_mb)
        run_dir = a.study_dir / records.allreduce_dir(n)
        out.append(
            RunSpec(
                i,
                allreduce_overrides(a.manifest.allreduce_max_mb),
                bench,
                a.launcher.plan(bench, run_dir, a.study_dir),
            )
        )
    return out


def _holds(launcher: Launcher, cfg: Config) -> bool:
    """Can this launcher start the analysis after the other jobs without anyone waiting?"""
    return launcher.sequential or launcher.held_until(cfg, []) is not None


def submit_study(study_dir: Path, reporter: Reporter, script: Path) -> Submitted:
    """Submit the study's unfinished points, its missing allreduce benchmarks and, after them,
    its analysis job; return at once. Everything is checked before anything is submitted."""
    with study_lock(study_dir):
        a = plan_attempt(study_dir, reporter)
        if one_allocation(a):
            return _driven(a)
        launcher = a.launcher
        specs = [*a.runs, *_benchmark_specs(a)]
        cfg = analysis_config(next(iter(a.configs.values())), study_dir, script)
        validate_points([cfg], [records.ANALYSIS], launcher.facts)
        if not _holds(launcher, cfg):
            raise LaunchError(
                f"the {launcher.name} launcher can neither hold a job until others end nor runs its "
                "jobs one after another: run the study without --analyze-as-job"
            )
        run_dir = study_dir / records.ANALYSIS
        analysis = RunSpec(len(specs), [], cfg, launcher.plan(cfg, run_dir, study_dir))
        launcher.admit([*specs, analysis])  # before a directory is renamed
        for spec in [*specs, analysis]:
            keep_aside(spec.run_dir)
        if launcher.sequential:  # one after another anyway: the analysis is the last of them
            jobs = launcher.submit([*specs, analysis], study_dir, detach=True)
        else:
            jobs = launcher.submit(specs, study_dir, detach=True) if specs else []
            held = launcher.held_until(cfg, [After(j, ok=False) for j in jobs]) or cfg
            analysis = RunSpec(analysis.index, [], held, launcher.plan(held, run_dir, study_dir))
            jobs += launcher.submit([analysis], study_dir, detach=True)
        record_attempt(a, [*specs, analysis], jobs)
        return Submitted(jobs[: len(a.runs)], jobs[len(a.runs) : -1], jobs[-1])


def gather(study_dir: Path, say: Callable[[str], None]) -> None:
    """What the waiting `hpctrain study` does after its runs end, done by the analysis job: each
    completed point's cost from the scheduler's accounting, each benchmark's result where the
    analysis reads it. A point or benchmark that did not complete is said and left out."""
    jobs = [j for j in jobs_in(study_dir) if j.run_dir.name != records.ANALYSIS]
    for job, status, _ in statuses(jobs):  # each launcher asked once for all of them
        run_dir = job.run_dir
        if status.state != State.COMPLETED:
            say(f"{run_dir.name}: {status.state}; left out")
            continue
        if (run_dir / records.SUMMARY).exists():
            accounted(launcher_of(job), job)
        for result in run_dir.glob("allreduce-n*.json"):  # a benchmark's, beside the points
            try:
                records.write(study_dir / result.name, records.read(result, records.AllreduceResult))
            except RecordError as e:
                say(f"{result}: {e}; left out")
