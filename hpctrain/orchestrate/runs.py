"""Runs and sweeps from overrides to results, through whichever launcher the config names. No
argparse and no printing: the CLI parses, calls these, and renders what they return; what
happens meanwhile goes to a Reporter."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from hpctrain import records
from hpctrain.config.derived import default_run_dir
from hpctrain.config.load import load_config
from hpctrain.config.points import load_configs
from hpctrain.config.schema import Config
from hpctrain.errors import ConfigError
from hpctrain.events import parse_event
from hpctrain.launch.base import After, Job, JobStatus, Launcher, RunSpec
from hpctrain.launch.registry import launcher_class, launcher_for, load_job
from hpctrain.launch.rundir import claim_fresh, undone_if_refused
from hpctrain.orchestrate.after import held, wait_for
from hpctrain.orchestrate.started import by_launcher, jobs_in, launcher_of
from hpctrain.orchestrate.sweep import expand
from hpctrain.orchestrate.validate import check_memory, memory_key, validate_points
from hpctrain.records import State

# kept in the logs, not shown: submitit's own lines (in its format, or in a Hydra job's logging
# format: "[date][submitit][INFO] - ..."), and the profiler's stage markers (Kineto prints
# "USDT:<date> ... profiler_start" on every start and stop)
NOT_SHOWN = re.compile(r"submitit |\[[^]]*\]\[submitit\]\[|(USDT|STAGE):\d{4}-\d\d-\d\d ")
# Open MPI's banners (a paragraph between lines of dashes: "Primary job terminated normally, but 1
# process returned a non-zero exit code...") stay in logs/launcher.log: what they say reaches the
# user as hpctrain's own one-line account (the failed rank, its signal, a restart)
BANNER_RULE = re.compile(r"-{20,}\s*$")


class Reporter(Protocol):
    def note(self, text: str) -> None: ...  # a message for the user
    def line(self, text: str) -> None: ...  # an output line of rank 0 or of the launcher
    def event(self, event: dict[str, Any]) -> None: ...  # a progress event of rank 0
    def begin(self, label: str, steps: int) -> None: ...  # a run starts: a fresh progress bar


@dataclass
class Prepared:
    launcher: Launcher
    runs: list[RunSpec]
    group_dir: Path | None  # the sweep directory, or None for a single run
    dated: bool = True  # the directory is hpctrain's dated default (run.dir unset): may take a suffix
    after: list[After] = dataclasses.field(default_factory=list)  # jobs to wait for before starting


def one_launcher(configs: Sequence[Config]) -> Launcher:
    names = sorted({c.cluster.name for c in configs})
    if len(names) > 1:
        raise ConfigError.one(
            "cluster",
            f"a sweep must use one launcher (found {', '.join(names)})",
            "sweep over one cluster= option at a time",
        )
    return launcher_for(configs[0])


def prepare(
    overrides: Sequence[str],
    config_dir: str | None = None,
    multirun: bool = False,
    now: datetime | None = None,
    after: Sequence[str] = (),
    say: Callable[[str], None] = lambda s: None,
    memory: bool = True,
    composed: Config | None = None,
) -> Prepared:
    """Compose, validate and plan every run (every point of a sweep) before anything starts;
    `after`: what the runs start after, besides their run.after (orchestrate/after.py); `memory`:
    refuse points predicted not to fit (--estimate shows them instead); `composed`: the single
    run's config, composed already (refusals)."""
    points = expand(overrides, config_dir) if multirun else [list(overrides)]
    if multirun:
        configs = load_configs(points, config_dir)
    else:
        configs = [composed if composed is not None else load_config(overrides, config_dir)]
    for c in configs:  # hpctrain run --after DIR[:ok|:any]
        c.run = dataclasses.replace(c.run, after=[*c.run.after, *after])
    launcher = one_launcher(configs)
    configs, waits = held(launcher, configs)
    labels = point_labels(points) if multirun else [""]
    validate_points(configs, labels, launcher.facts)
    bounds = check_memory(launcher, configs, labels, say) if memory else {}
    keys = [memory_key(c) for c in configs] if bounds else []  # before placed() sets run.dir
    base = default_run_dir(configs[0], now or datetime.now())
    items = list(zip([list(pt) for pt in points], configs))
    # run.dir of a sweep is its directory, as given; the dated default gets "-sweep"
    home = base if not multirun or configs[0].run.dir else base.parent / f"{base.name}-sweep"
    p = placed(launcher, items, home, multirun, dated=configs[0].run.dir is None)
    p.after = waits
    if bounds:  # the memory check each run passed, in its plan
        p.runs = [
            dataclasses.replace(r, plan=dataclasses.replace(r.plan, memory=bounds[k])) if k in bounds else r
            for r, k in zip(p.runs, keys)
        ]
    return p


def refusals(points: Sequence[Sequence[str]], config_dir: str | None = None) -> list[ConfigError | None]:
    """What prepare() refuses each single run with (None: nothing), the configs composed together
    as a sweep's points are (load_configs: one compose, not one each, 0.2 CPU-s apiece); each on
    its own where one of them does not compose, so that the error is that point's."""
    try:
        configs: list[Config | None] = list(load_configs(points, config_dir))
    except ConfigError:
        configs = [None] * len(points)
    out: list[ConfigError | None] = []
    for pt, cfg in zip(points, configs):
        try:
            prepare(pt, config_dir, composed=cfg)
            out.append(None)
        except ConfigError as e:
            out.append(e)
    return out


def placed(
    launcher: Launcher, items: list[tuple[list[str], Config]], home: Path, sweep: bool, dated: bool
) -> Prepared:
    """The runs planned in `home`: the run directory, or the sweep directory with one per point."""
    home = home.resolve()
    if not sweep:
        ((overrides, cfg),) = items
        return Prepared(launcher, [RunSpec(0, overrides, cfg, launcher.plan(cfg, home))], None, dated)
    for i, (_, c) in enumerate(items):  # each point's config says where its run really is
        c.run = dataclasses.replace(c.run, dir=str(home / str(i)))  # points may share sections
    runs = [RunSpec(i, o, c, launcher.plan(c, home / str(i), home)) for i, (o, c) in enumerate(items)]
    return Prepared(launcher, runs, home, dated)


def point_labels(points: Sequence[Sequence[str]]) -> list[str]:
    """How an error names each sweep point: its number and the overrides that vary."""
    common = set.intersection(*(set(p) for p in points)) if points else set()
    return [f"point {i} ({' '.join(o for o in p if o not in common)})" for i, p in enumerate(points)]


def start(
    p: Prepared, detach: bool, say: Callable[[str], None] = lambda s: None, timeout_s: float = 7 * 86400
) -> list[Job]:
    """Start or submit; a sweep directory gets sweep.json (its runs, jobs and job arrays). A dated
    default directory that another command took in the same second becomes NAME-2, NAME-3, ...
    Jobs the launcher cannot have its scheduler wait for (p.after) are waited for here first."""
    p.launcher.admit(p.runs)
    if p.after:
        wait_for(p.after, timeout_s, say)
    home = p.group_dir or p.runs[0].run_dir
    with undone_if_refused([home, *(r.run_dir for r in p.runs)]) as made:
        if p.dated:
            claimed = claim_fresh(home)
            if claimed != home:
                made.append(claimed)
                items = [(r.overrides, r.cfg) for r in p.runs]
                p = placed(p.launcher, items, claimed, p.group_dir is not None, dated=True)
        jobs = p.launcher.submit(p.runs, p.group_dir, detach=detach)
    if p.group_dir is not None:
        write_sweep(p.group_dir, p.launcher.name, p.runs, jobs)
    return jobs


def write_sweep(
    sweep_dir: Path, launcher: str, runs: list[RunSpec], jobs: list[Job]
) -> records.SweepManifest:
    arrays: dict[str, int] = {}
    for job in jobs:
        if "_" in job.job_id:
            array = job.job_id.split("_")[0]
            arrays[array] = arrays.get(array, 0) + 1
    index = {a: i for i, a in enumerate(arrays)}
    manifest = records.new(
        records.SweepManifest,
        sweep_dir=str(sweep_dir),
        launcher=launcher,
        runs=[
            records.SweepRun(
                r.index, r.overrides, str(r.run_dir), j.job_id, index.get(j.job_id.split("_")[0], 0)
            )
            for r, j in zip(runs, jobs)
        ],
        arrays=[records.ArrayRef(a, n) for a, n in arrays.items()],
    )
    records.write(sweep_dir / records.SWEEP, manifest, indent=None)  # 10,000 runs: one line, C-encoded
    return manifest


class LogFollower:
    """Feeds new lines of a run's output files to the reporter: progress events as events,
    the rest as lines (submitit's own chatter left out)."""

    def __init__(
        self,
        paths: list[Path],
        reporter: Reporter,
        pending: Callable[[dict[str, JobStatus]], None] | None = None,  # also told each poll's states
    ) -> None:
        self.offsets = {p: 0 for p in paths}
        self.in_banner = {p: False for p in paths}
        self.reporter = reporter
        self.pending = pending

    def __call__(self, states: dict[str, JobStatus] | None = None) -> None:
        if self.pending is not None and states is not None:
            self.pending(states)
        for path, offset in self.offsets.items():
            lines, self.offsets[path] = records.read_new_lines(path, offset)
            for line in lines:
                if BANNER_RULE.match(line):
                    self.in_banner[path] = not self.in_banner[path]
                    continue
                if self.in_banner[path]:
                    continue
                event = parse_event(line)
                if event is not None:
                    self.reporter.event(event)
                elif not NOT_SHOWN.match(line):
                    self.reporter.line(line)


class PendingNotes:
    """Tells the user why jobs wait (the scheduler's pending reason), once per change."""

    def __init__(self, reporter: Reporter) -> None:
        self.reporter = reporter
        self.last: dict[str, int] = {}

    def __call__(self, states: dict[str, JobStatus]) -> None:
        now: dict[str, int] = {}
        for st in states.values():
            if st.state == State.PENDING and st.reason.startswith("pending: "):
                now[st.reason] = now.get(st.reason, 0) + 1
        for reason, n in now.items():
            if reason not in self.last:
                self.reporter.note(f"{n} job(s) {reason}" if len(states) > 1 else f"job {reason}")
        self.last = now


def follow(
    launcher: Launcher,
    jobs: list[Job],
    reporter: Reporter,
    timeout_s: float,
    labels: Sequence[str] = (),
    steps: Sequence[int] = (),
    tick: Callable[[], None] | None = None,
) -> dict[str, JobStatus]:
    """Wait for the jobs, showing the output of the one running (one job, or a launcher that runs
    a sweep's points one after another); a concurrent sweep is only polled. On an interrupt a
    launcher that owns its jobs (local) cancels them; SLURM jobs keep running, and say so.
    `tick` is called at every poll (live tracking)."""
    notes = PendingNotes(reporter)

    def pending(states: dict[str, JobStatus]) -> None:
        notes(states)
        if tick is not None:
            tick()

    try:
        if len(jobs) > 1 and not launcher.sequential:
            return launcher.wait(jobs, timeout_s, poll_s=2.0, on_poll=pending)
        states: dict[str, JobStatus] = {}
        poll = 0.1 if launcher.sequential else 1.0  # local: reading state.json, ~1 ms a look
        for i, job in enumerate(jobs):
            reporter.begin(labels[i] if i < len(labels) else "", steps[i] if i < len(steps) else 0)
            tail = LogFollower(launcher.follow_paths(job), reporter, pending)
            states.update(launcher.wait([job], timeout_s, poll_s=poll, on_poll=tail))
            tail()
        return states
    except KeyboardInterrupt:
        if launcher.cancel_on_interrupt:
            launcher.cancel(jobs)
        elif not launcher.interrupt_ends_runs():  # else they end with what holds them (held())
            reporter.note(
                f"job(s) {', '.join(j.job_id for j in jobs)} keep running: "
                f"hpctrain cancel {jobs[0].run_dir.parent if len(jobs) > 1 else jobs[0].run_dir}"
            )
        raise


def resubmitted(
    launcher: Launcher,
    spec: RunSpec[Any],
    job: Job,
    states: dict[str, JobStatus],
    follow_one: Callable[[list[Job]], dict[str, JobStatus]],
    say: Callable[[str], None],
) -> tuple[Job, dict[str, JobStatus]]:
    """A run whose pre-flight check judged nodes bad (records/preflight.py), submitted again
    without them and followed, at most cluster.preflight.max_resubmits times, on a launcher
    that can exclude nodes; the last job and its states."""
    from hpctrain.launch.base import Excludes
    from hpctrain.records.preflight import bad_hosts, checks

    while states[job.job_id].state != State.COMPLETED and isinstance(launcher, Excludes):
        newer = load_job(job.run_dir)  # the job's own teardown may have submitted it again
        if newer.job_id != job.job_id:
            say(f"pre-flight: the run was submitted again as job {newer.job_id} without its bad nodes")
            job, states = newer, follow_one([newer])
            continue
        done = checks(job.run_dir)
        bad = bad_hosts(done[-1]) if done else []
        failed = sum(1 for c in done if bad_hosts(c))
        if not bad or failed > spec.cfg.cluster.preflight.max_resubmits:
            break
        spec, job = launcher.resubmit_excluding(spec, bad)
        say(f"pre-flight: node(s) {', '.join(bad)} judged bad; submitted again as job {job.job_id} without them "
            f"({failed} of cluster.preflight.max_resubmits={spec.cfg.cluster.preflight.max_resubmits})")  # fmt: skip
        states = follow_one([job])
    return job, states


def result(launcher: Launcher, job: Job, status: JobStatus) -> records.RunSummary:
    """The run's summary, or the error that explains why there is none."""
    if status.state != State.COMPLETED:
        raise launcher.failure(job, status)
    return accounted(launcher, job)


def accounted(launcher: Launcher, job: Job) -> records.RunSummary:
    """A completed run's summary, with the scheduler's accounting of its cost written into it
    (once: SLURM's sacct, every incarnation of a requeued job)."""
    summary = records.read(job.run_dir / records.SUMMARY, records.RunSummary)
    if summary.cost_source == "allocation":
        better = launcher.accounted(job, summary)
        if better is not summary:
            records.write(job.run_dir / records.SUMMARY, better)
            return better
    return summary


# --- runs already started: from their directories ---------------------------------------------


def unstarted_in(path: Path) -> list[tuple[str, str]]:
    """A study's runs that have no job (not started yet, or their directory is not one): (name,
    why), so that status lists every run of the study, as analyze does."""
    if (path / records.JOB).exists() or not (path / records.STUDY).exists():
        return []
    study = records.read(path / records.STUDY, records.StudyManifest)
    out = []
    for r in study.runs:
        d = records.member_dir(path, r.run_dir)
        if d.exists() and not d.is_dir():
            out.append((r.name, f"{d} is not a directory"))
        elif not (d / records.JOB).exists() and not (d / records.SUMMARY).exists():  # not copied records
            out.append((r.name, "not started yet"))
    return out


def overrides_in(path: Path) -> dict[str, list[str]]:
    """Each run's overrides by run directory name, for a sweep or study directory ({} otherwise)."""
    manifest: records.SweepManifest | records.StudyManifest
    if (path / records.SWEEP).exists():
        manifest = records.read(path / records.SWEEP, records.SweepManifest)
    elif (path / records.STUDY).exists():
        manifest = records.read(path / records.STUDY, records.StudyManifest)
    else:
        return {}
    return {Path(r.run_dir).name: list(r.overrides) for r in manifest.runs}


def statuses(jobs: list[Job]) -> list[tuple[Job, JobStatus, str]]:
    """(job, status, error line) for each job, asking each launcher once."""
    found: dict[str, JobStatus] = {}
    for name, group in by_launcher(jobs).items():
        found.update(launcher_class(name)().status(group))
    out = []
    for job in jobs:
        st = found.get(
            job.job_id, JobStatus(job.job_id, State.PENDING, reason="not in the scheduler's records yet")
        )
        error = ""
        if st.done and st.state != State.COMPLETED:
            error = str(launcher_of(job).failure(job, st)).splitlines()[0]
        out.append((job, st, error))
    return out


def cancel(path: Path) -> tuple[list[Job], list[tuple[Job, JobStatus]]]:
    """Cancel the jobs of a run, sweep or study that have not ended; return (cancelled, ended)."""
    active: list[Job] = []
    ended = []
    for job, st, _ in statuses(jobs_in(path)):
        if st.done:
            ended.append((job, st))
        else:
            active.append(job)
    for name, group in by_launcher(active).items():
        launcher_class(name)().cancel(group)
    return active, ended


def dependents(jobs: list[Job]) -> dict[str, list[tuple[str, str]]]:
    """The scheduler's jobs held until one of `jobs` ends (hpctrain run --after), by launcher,
    each with how it waits (launch.base.Launcher.dependents)."""
    found = {name: launcher_class(name)().dependents(group) for name, group in by_launcher(jobs).items()}
    return {name: ids for name, ids in found.items() if ids}


def cancel_dependents(found: dict[str, list[tuple[str, str]]]) -> None:
    for name, waiting in found.items():
        launcher_class(name)().cancel_ids([job_id for job_id, _ in waiting])
