"""Runs already started, found again from their directories: the jobs a run, sweep or study
directory holds, and the launcher that started each."""

from __future__ import annotations

from pathlib import Path

from hpctrain import records
from hpctrain.errors import RecordError
from hpctrain.launch.base import Job, Launcher
from hpctrain.launch.registry import launcher_class, load_job


def jobs_in(path: Path) -> list[Job]:
    """The jobs of a run directory, a sweep directory, a study directory (its points, then its
    allreduce benchmarks and its analysis job) or a tune directory (its trials, then the allocation they ran in)."""
    if (path / records.JOB).exists():
        return [load_job(path)]
    if (path / records.SWEEP).exists():
        manifest = records.read(path / records.SWEEP, records.SweepManifest)
        return [load_job(records.member_dir(path, r.run_dir)) for r in manifest.runs]
    if (path / records.STUDY).exists():
        study = records.read(path / records.STUDY, records.StudyManifest)
        dirs = [records.member_dir(path, r.run_dir) for r in study.runs]
        dirs = [d for d in dirs if (d / records.JOB).exists()] + records.study_jobs_dirs(path)
        return [load_job(d) for d in dirs]
    if (path / records.TUNE).exists():
        tune = records.read(path / records.TUNE, records.TuneManifest)
        dirs = [path / t.name for t in tune.trials] + [path / records.ALLOCATION]
        return [load_job(d) for d in dirs if (d / records.JOB).exists()]
    raise RecordError(
        f"{path} is not a run, sweep, study or tune directory (no {records.JOB}, {records.SWEEP}, "
        f"{records.STUDY} or {records.TUNE})"
    )


def by_launcher(jobs: list[Job]) -> dict[str, list[Job]]:
    """The jobs grouped by the launcher that started them (each asked once, for its group)."""
    out: dict[str, list[Job]] = {}
    for job in jobs:
        out.setdefault(job.ref.launcher, []).append(job)
    return out


def launcher_of(job: Job) -> Launcher:
    return launcher_class(job.ref.launcher)()
