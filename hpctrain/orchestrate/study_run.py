"""Running a scaling study: create it (every point validated before the first starts), run the
unfinished points through the config's launcher, measure allreduce once per world size, and
analyze. The expansion itself is pure (study.py)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from hpctrain import records
from hpctrain.config.derived import default_run_dir, world_size
from hpctrain.config.load import load_config
from hpctrain.config.points import load_configs
from hpctrain.config.schema import Config
from hpctrain.config.validate import SAFE_NAME
from hpctrain.errors import HpctrainError, RecordError, RunsFailed
from hpctrain.launch.base import Job, JobStatus, Launcher, RunSpec
from hpctrain.launch.rundir import claim_fresh
from hpctrain.orchestrate.lock import writer_lock
from hpctrain.orchestrate.probe import run_allreduce
from hpctrain.orchestrate.runs import Reporter, accounted, follow, one_launcher, write_sweep
from hpctrain.orchestrate.study import expand_study
from hpctrain.orchestrate.validate import check_memory, validate_points
from hpctrain.records import State


@dataclass(frozen=True)
class PlannedStudy:
    """A study composed and validated, nothing created: its directory, manifest (not yet written:
    see write_study), whether the directory is the dated default (run.dir unset, so it may take a
    suffix when taken), each run's config (in the manifest's order) and the launcher."""

    study_dir: Path
    manifest: records.StudyManifest
    dated: bool
    configs: list[Config]
    launcher: Launcher


def create_study(
    kind: str,
    overrides: Sequence[str],
    config_dir: str | None = None,
    now: datetime | None = None,
    say: Callable[[str], None] = lambda s: None,
    admit: bool = False,
) -> tuple[Path, records.StudyManifest, bool]:
    """The study's directory, its manifest (not yet written: see write_study), and whether the
    directory is the dated default (run.dir unset), which may take a suffix when taken. `say`
    hears what the checks note (a point whose memory could not be predicted); `admit`: ask the
    scheduler whether it takes the points (launch.base.Launcher.admit) before the study's
    directory exists, as a study that is about to start does (a dry run plans only)."""
    s = plan_study(kind, overrides, config_dir, now, say=say)
    if admit:
        planned = zip(s.manifest.runs, s.configs)
        s.launcher.admit(
            [
                RunSpec(i, r.overrides, c, s.launcher.plan(c, Path(r.run_dir), s.study_dir))
                for i, (r, c) in enumerate(planned)
            ]
        )
    return s.study_dir, s.manifest, s.dated


def plan_study(
    kind: str,
    overrides: Sequence[str],
    config_dir: str | None = None,
    now: datetime | None = None,
    memory: bool = True,
    say: Callable[[str], None] = lambda s: None,
) -> PlannedStudy:
    """create_study's figures and the configs and launcher it composed them from."""
    user = [*overrides, f"study={kind}"]
    base = load_config(user, config_dir)
    points = expand_study(base)
    configs = load_configs([[*user, *p.overrides] for p in points], config_dir)
    launcher = one_launcher(configs)
    validate_points(configs, [p.name for p in points], launcher.facts)  # all before the first starts
    if memory:  # --estimate shows the memory of every point instead
        check_memory(launcher, configs, [p.name for p in points], say)
    stem = default_run_dir(base, now or datetime.now())
    study_dir = (stem.parent / f"{stem.name}-{kind}").resolve()
    study = base.study
    assert study is not None  # expand_study checked it
    manifest = records.new(
        records.StudyManifest,
        kind=kind,
        launcher=launcher.name,
        config_dir=config_dir,
        allreduce_bench=study.allreduce_bench,
        allreduce_max_mb=study.allreduce_max_mb,
        runs=[
            records.StudyRun(
                p.name, p.scale, p.rep, world_size(c), [*user, *p.overrides], str(study_dir / p.name)
            )
            for p, c in zip(points, configs)
        ],
    )
    return PlannedStudy(study_dir, manifest, base.run.dir is None, configs, launcher)


def write_study(
    study_dir: Path, manifest: records.StudyManifest, dated: bool
) -> tuple[Path, records.StudyManifest]:
    """Create the study directory and its study.json. A dated default directory that another
    command took in the same second becomes NAME-2, ...; an explicit one must not exist."""
    if dated:
        claimed = claim_fresh(study_dir)
        if claimed != study_dir:
            runs = [dataclasses.replace(r, run_dir=str(claimed / r.name)) for r in manifest.runs]
            manifest = dataclasses.replace(manifest, runs=runs)
            study_dir = claimed
    else:
        try:
            study_dir.mkdir(parents=True)
        except FileExistsError as e:
            raise HpctrainError(
                f"study directory {study_dir} already exists; resume it with hpctrain study resume {study_dir}"
            ) from e
        except OSError as e:
            raise HpctrainError(f"cannot create study directory {study_dir}: {e}") from e
    records.write(study_dir / records.STUDY, manifest)
    return study_dir, manifest


def pending(manifest: records.StudyManifest) -> list[records.StudyRun]:
    return [r for r in manifest.runs if not (Path(r.run_dir) / records.SUMMARY).exists()]


def keep_aside(run_dir: Path) -> None:
    """A failed attempt's directory is kept, renamed, never overwritten."""
    if run_dir.exists():
        run_dir.rename(run_dir.with_name(f"{run_dir.name}.failed-{int(time.time())}"))


def study_lock(study_dir: Path) -> AbstractContextManager[None]:
    """One hpctrain at a time runs a study (lock.py)."""
    return writer_lock(study_dir, "study", f"hpctrain study resume {study_dir}")


def checked_runs(study_dir: Path, manifest: records.StudyManifest) -> records.StudyManifest:
    """Every run of study.json lives in its own directory inside the study, whatever the file
    says: resume renames and writes only there. A study copied or moved as a whole (`cp -a`) is
    resumed where it now is: its runs are found by name, and study.json says so from then on."""
    seen: set[str] = set()
    here = study_dir.resolve()
    for r in manifest.runs:
        if not SAFE_NAME.match(r.name) or r.name in seen or Path(r.run_dir).name != r.name:
            raise RecordError(
                f"{study_dir / records.STUDY}: run {r.name!r} has run_dir {r.run_dir!r}; every run must be "
                f"a distinct directory of the study named as the run ({here / r.name}): the file was edited"
            )
        seen.add(r.name)
    if all(Path(r.run_dir) == here / r.name for r in manifest.runs):
        return manifest
    runs = [dataclasses.replace(r, run_dir=str(here / r.name)) for r in manifest.runs]
    moved = dataclasses.replace(manifest, runs=runs)
    records.write(study_dir / records.STUDY, moved)
    return moved


def run_study(study_dir: Path, reporter: Reporter, timeout_s: float) -> None:
    """Run the unfinished points of the study (all of them the first time)."""
    with study_lock(study_dir):
        _run_study(study_dir, reporter, timeout_s)


def _in_flight(launcher: Launcher, runs: list[records.StudyRun], ours: Sequence[str] = ()) -> list[str]:
    """Runs whose job is still pending or running (e.g. SLURM jobs of an interrupted `study`),
    but for steps of the study's own earlier allocations (`ours`: ending it ends them)."""
    jobs = [Job.load(Path(r.run_dir)) for r in runs if (Path(r.run_dir) / records.JOB).exists()]
    jobs = [j for j in jobs if j.job_id.split(".")[0] not in ours]
    if not jobs:
        return []
    states = launcher.status(jobs)
    return [
        f"{j.run_dir.name} (job {j.job_id} {states[j.job_id].state})"
        for j in jobs
        if j.job_id in states and not states[j.job_id].done
    ]


@dataclass(frozen=True)
class Attempt:
    """One go at a study's unfinished points, planned and checked, nothing started: the manifest,
    every run's config by name (composed once), the launcher, the points to run and their specs."""

    study_dir: Path
    manifest: records.StudyManifest
    configs: dict[str, Config]
    launcher: Launcher
    todo: list[records.StudyRun]
    runs: list[RunSpec]

    def benchmarks(self) -> list[tuple[int, Config]]:
        """(world size, the config of its first run) for each world size above one whose allreduce
        benchmark has no result yet (the benchmark runs on that run's resources)."""
        if not self.manifest.allreduce_bench:
            return []
        first: dict[int, Config] = {}
        for r in self.manifest.runs:
            first.setdefault(r.world_size, self.configs[r.name])
        return [
            (n, cfg)
            for n, cfg in sorted(first.items())
            if n > 1 and not (self.study_dir / records.allreduce_file(n)).exists()
        ]


def plan_attempt(study_dir: Path, reporter: Reporter) -> Attempt:
    """Check the study again (the code or the config directory may have changed since it was
    created) and plan its unfinished points; refuse while some of its jobs are still in flight."""
    manifest = checked_runs(study_dir, records.read_study(study_dir))
    todo = pending(manifest)
    done = len(manifest.runs) - len(todo)
    if done:
        reporter.note(f"{done} run(s) already finished; running the other {len(todo)}")
    configs: dict[str, Config] = dict(
        zip(
            (r.name for r in manifest.runs),
            load_configs([r.overrides for r in manifest.runs], manifest.config_dir),
        )
    )
    launcher = one_launcher(list(configs.values()))
    validate_points(list(configs.values()), list(configs), launcher.facts)
    check_memory(launcher, list(configs.values()), list(configs), reporter.note)
    busy = _in_flight(launcher, todo, manifest.allocations)
    if busy:
        raise HpctrainError(
            f"{len(busy)} run(s) of the study are still in flight: {', '.join(busy)}; wait for them "
            f"(hpctrain status {study_dir}) or cancel them (hpctrain cancel {study_dir}), then resume"
        )
    runs = [
        RunSpec(i, r.overrides, configs[r.name], launcher.plan(configs[r.name], Path(r.run_dir), study_dir))
        for i, r in enumerate(todo)
    ]
    return Attempt(study_dir, manifest, configs, launcher, todo, runs)


def start_attempt(a: Attempt, detach: bool = False) -> list[Job]:
    """Submit the attempt's runs, each into a fresh directory (an earlier attempt's is kept
    aside), recorded as attempt-T; their jobs, in that order."""
    a.launcher.admit(a.runs)  # before a directory is renamed
    for spec in a.runs:
        keep_aside(spec.run_dir)
    jobs = a.launcher.submit(a.runs, a.study_dir, detach=detach)
    record_attempt(a, a.runs, jobs)
    return jobs


def record_attempt(a: Attempt, specs: Sequence[RunSpec], jobs: list[Job]) -> None:
    write_sweep(a.study_dir / f"attempt-{int(time.time())}", a.launcher.name, list(specs), jobs)


def one_allocation(a: Attempt) -> bool:
    return any(c.study is not None and c.study.one_allocation for c in a.configs.values())


def _run_study(study_dir: Path, reporter: Reporter, timeout_s: float) -> None:
    a = plan_attempt(study_dir, reporter)
    if one_allocation(a) and (a.runs or a.benchmarks()):
        _in_one_allocation(a, reporter, timeout_s)
        return
    launcher, todo, configs = a.launcher, a.todo, a.configs
    if a.runs:
        jobs = start_attempt(a)
        if not launcher.sequential:
            reporter.note(
                f"submitted {len(a.runs)} run(s) as {len({j.job_id.split('_')[0] for j in jobs})} job array(s)"
            )
        labels = [
            f"study run {i + 1}/{len(todo)}: {r.name} ({r.world_size} ranks)" for i, r in enumerate(todo)
        ]
        states = follow(
            launcher, jobs, reporter, timeout_s, labels, [configs[r.name].train.steps for r in todo]
        )
        failures: list[str] = []
        for r, job in zip(todo, jobs):
            _settled(a, reporter, r, job, states[job.job_id], failures)
    _benchmarks(a, reporter)


def _settled(
    a: Attempt, reporter: Reporter, r: records.StudyRun, job: Job, st: JobStatus, failures: list[str]
) -> None:
    """An ended point: a failure is said and kept (one failed point does not stop the study;
    analyze lists it), a completion gets its cost from the scheduler's accounting; RunsFailed
    once every run of the study has failed."""
    if st.state != State.COMPLETED:
        failures.append(f"{r.name} failed: {str(a.launcher.failure(job, st)).splitlines()[0]}")
        reporter.note(failures[-1])
    else:
        accounted(a.launcher, job)
    if len(failures) == len(a.manifest.runs):
        raise RunsFailed(f"every run of the study failed, the first: {failures[0]}\n  study: {a.study_dir}")


def _in_one_allocation(a: Attempt, reporter: Reporter, timeout_s: float) -> None:
    """study.one_allocation: hold the largest point's nodes once (the allocation `tune` holds:
    launch/slurm/allocation.py) for the runs' time limits together, then start every unfinished
    point as a job step of it, one after another in the study's order (repetitions interleaved;
    a smaller point on a subset of the same nodes), then the allreduce benchmarks. The
    allocation is recorded in study.json; a resumed study ends its earlier one (hold) and says so."""
    launcher, earlier = a.launcher, a.manifest.allocations
    home = a.study_dir / records.ALLOCATION
    biggest, minutes = allocation_terms(a)
    if earlier:
        reporter.note(f"the study ran in allocation {earlier[-1]} before; what is left runs in a new one")
    launcher.admit(a.runs)
    failures: list[str] = []
    with launcher.held(biggest.cfg, home, minutes, reporter.note):
        alloc = records.read(home / records.JOB, records.JobRef).job_id
        manifest = dataclasses.replace(a.manifest, allocations=[*earlier, alloc])
        records.write(a.study_dir / records.STUDY, manifest)
        reporter.note(f"every point runs as a job step of allocation {alloc}, one after another")
        for i, spec in enumerate(a.runs):
            keep_aside(spec.run_dir)
            (job,) = launcher.submit([spec], a.study_dir)
            record_attempt(a, [spec], [job])
            r = a.todo[i]
            label = f"study run {i + 1}/{len(a.todo)}: {r.name} ({r.world_size} ranks, step {job.job_id})"
            st = follow(launcher, [job], reporter, timeout_s, [label], [spec.cfg.train.steps])[job.job_id]
            _settled(a, reporter, r, job, st, failures)
        _benchmarks(a, reporter)


def allocation_terms(a: Attempt) -> tuple[RunSpec, float]:
    """The spec whose shape the allocation takes (the largest point: the benchmarks run on the
    shape of a point of their world size), and the minutes its runs may take one after another."""
    biggest = max(a.runs or [_any_spec(a)], key=lambda r: (r.plan.nodes, r.plan.world_size))
    return biggest, sum(float(getattr(r.cfg.cluster, "time_min", 0)) for r in a.runs)


def _any_spec(a: Attempt) -> RunSpec:
    """A spec of the study's largest point (only benchmarks are left to run)."""
    r = max(a.manifest.runs, key=lambda r: r.world_size)
    return RunSpec(0, r.overrides, a.configs[r.name], a.launcher.plan(a.configs[r.name], Path(r.run_dir)))


def _benchmarks(a: Attempt, reporter: Reporter) -> None:
    for n, cfg in a.benchmarks():
        reporter.note(f"allreduce benchmark on {n} ranks")
        run_dir = a.study_dir / records.allreduce_dir(n)
        keep_aside(run_dir)
        result = run_allreduce(a.launcher, cfg, run_dir, a.manifest.allreduce_max_mb)
        records.write(a.study_dir / records.allreduce_file(n), result)


def load_study(study_dir: Path) -> records.StudyManifest:
    return records.read_study(study_dir)
