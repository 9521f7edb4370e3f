"""`hpctrain tune`: plan the search (the engine's and the parallelism's knobs, every value checked
against the config before anything starts), run its trials one after another as ordinary short
runs in <tune>/trial-K (so status, logs, tracking and analysis work on each), refit and prune as
analysis/tune.py says, and write tune.json after every trial and best.yaml at the end.

The search is deterministic given its trials' results, so resuming replays it: a trial whose run
finished with the same settings is read back, not run again; one that did not is set aside and
run again."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import yaml

from hpctrain import records
from hpctrain.analysis.estimate import NoEstimate, PointEstimate, estimate_point
from hpctrain.analysis.evidence import from_run
from hpctrain.analysis.tune import (
    Candidate,
    Knob,
    Search,
    Settings,
    Trial,
    candidate,
    changed,
    next_knob,
    override_text,
    verdict,
)
from hpctrain.config import load_config
from hpctrain.config.derived import default_run_dir
from hpctrain.config.schema import Config
from hpctrain.config.values import dotted
from hpctrain.engine.registry import engine_class
from hpctrain.errors import ConfigError, HpctrainError, LaunchError, Problem, RecordError, RunCancelled
from hpctrain.launch.base import Launcher
from hpctrain.launch.rundir import claim_fresh
from hpctrain.orchestrate.estimate import Point, probe_config, target_of
from hpctrain.orchestrate.lock import writer_lock
from hpctrain.orchestrate.probe import run_and_wait
from hpctrain.orchestrate.runs import prepare, refusals
from hpctrain.orchestrate.study_run import keep_aside
from hpctrain.orchestrate.validate import trains
from hpctrain.parallel.registry import kind_of


@dataclass
class Tuning:
    """A tune planned: the config, its launcher, the knobs with their valid values, the config's
    own settings, and the values left out before anything ran (invalid here), with why."""

    overrides: list[str]
    config_dir: str | None
    cfg: Config
    launcher: Launcher
    knobs: list[Knob]
    base: Settings
    invalid: list[str]


def _tune_problems(cfg: Config, world: int) -> list[Problem]:
    t, p = cfg.tune, []
    if cfg.script.path:
        p.append(Problem("script.path", "a script's settings are its own; tune searches hpctrain's trainer's", "drop script.path"))  # fmt: skip
    if world < 2:
        p.append(Problem("cluster", f"a tune needs at least 2 ranks (this config runs {world}): with one "
                         "there is nothing to communicate", "e.g. cluster.ranks=2, or cluster.nodes=2"))  # fmt: skip
    if t.budget_min <= 0:
        p.append(Problem("tune.budget_min", f"must be > 0 (got {t.budget_min:g})", "e.g. tune.budget_min=10"))
    if t.target_ranks < 0:
        p.append(Problem("tune.target_ranks", f"must be >= 0 (got {t.target_ranks})", "e.g. tune.target_ranks=64"))  # fmt: skip
    return p


def offered_knobs(cfg: Config) -> list[Knob]:
    """Every knob the engine and the parallelism offer for `cfg`."""
    engine = engine_class(str(cfg.parallelism.engine)).tune_knobs(cfg)
    return kind_of(cfg).tune_knobs(cfg, engine)


def chosen_knobs(cfg: Config) -> list[Knob]:
    """The offered knobs, restricted to tune.keys when given (an unknown key is an error)."""
    offered = offered_knobs(cfg)
    keys = list(cfg.tune.keys)
    unknown = [k for k in keys if k not in {o.key for o in offered}]
    if unknown:
        raise ConfigError.one(
            "tune.keys",
            f"{unknown} is not searched for engine={cfg.parallelism.engine}, parallelism={cfg.parallelism.name}",
            f"choose among {[o.key for o in offered]}, or leave tune.keys empty for all of them",
        )
    return [o for o in offered if not keys or o.key in keys]


def plan_tune(overrides: Sequence[str], config_dir: str | None) -> Tuning:
    """Compose and validate the config and every value of every knob on it; nothing is created."""
    prep = prepare(overrides, config_dir)
    (run,) = prep.runs
    cfg, launcher = run.cfg, prep.launcher
    problems = _tune_problems(cfg, run.plan.world_size)
    if problems:
        raise ConfigError(problems)
    if cfg.user_code and trains(cfg):  # a model and loss that do not fit: refused, not N failed trials
        from hpctrain.memory.trace import check_workload

        check_workload(cfg)
    target_config(cfg)  # tune.target_ranks must be a world the cluster can make
    knobs, invalid = [], []
    chosen = chosen_knobs(cfg)
    tried = [[*overrides, f"{knob.key}={override_text(v)}"] for knob in chosen for v in knob.values]
    refused = iter(refusals(tried, config_dir))
    for knob in chosen:
        ok = []
        for v in knob.values:
            e = next(refused)
            if e is None:
                ok.append(v)
            else:
                invalid.append(f"{knob.key}={override_text(v)}: {e.problems[0].rule}")
        if len(ok) > 1 or (ok and override_text(dotted(cfg, knob.key)) not in map(override_text, ok)):
            knobs.append(dataclasses.replace(knob, values=tuple(ok)))
    if not knobs:
        raise HpctrainError("nothing to tune: no setting of this config has another valid value")
    base = tuple((k.key, override_text(dotted(cfg, k.key))) for k in knobs)
    return Tuning(list(overrides), config_dir, cfg, launcher, knobs, base, invalid)


def target_config(cfg: Config) -> Config:
    """`cfg` at tune.target_ranks (0: as it is), by the cluster's own scale (ranks, nodes)."""
    want, scale = cfg.tune.target_ranks, cfg.cluster.study_scale
    if want in (0, cfg.cluster.world_size):
        return cfg
    per = cfg.cluster.world_size // max(getattr(cfg.cluster, scale), 1)
    if want % per:
        raise ConfigError.one(
            "tune.target_ranks",
            f"{want} ranks is not a whole number of cluster.{scale} of {per} rank(s) each",
            f"e.g. tune.target_ranks={per * max(want // per, 1)}",
        )
    return dataclasses.replace(cfg, cluster=dataclasses.replace(cfg.cluster, **{scale: want // per}))


def trial_shape(t: Tuning, home: Path) -> Config:
    """What the launcher holds resources for: a trial of the config (the knobs change no
    resource, so every trial has this shape)."""
    return probe_config(t.cfg, home / records.ALLOCATION)


def held_text(t: Tuning, home: Path) -> str:
    """What the tune would hold for its trials, for a dry run ("": the launcher holds nothing)."""
    return t.launcher.describe_held(trial_shape(t, home), home / records.ALLOCATION, t.cfg.tune.budget_min)


def tune_home(cfg: Config, now: datetime) -> Path:
    """The tune directory's path: run.dir, or the dated default <root>/<date>/<time>-<name>-tune."""
    stem = default_run_dir(cfg, now)
    return (stem if cfg.run.dir is not None else stem.with_name(f"{stem.name}-tune")).resolve()


def create_tune(t: Tuning, now: datetime | None = None) -> Path:
    """The tune directory (tune_home; the default gets a suffix when taken; run.dir must not
    exist)."""
    home = tune_home(t.cfg, now or datetime.now())
    if t.cfg.run.dir is None:
        return claim_fresh(home)
    try:
        home.mkdir(parents=True)
    except FileExistsError as e:
        raise HpctrainError(f"{home} already exists; resume a tune with hpctrain tune --resume {home}") from e
    except OSError as e:
        raise HpctrainError(f"cannot create the tune directory {home}: {e}") from e
    return home


@dataclass
class Tuned:
    tuning: Tuning
    home: Path
    manifest: records.TuneManifest
    target: PointEstimate | None
    no_target: str  # why there is no prediction at the target ("" : there is)


class Tuner:
    """Runs a planned tune in `home`: the trials, the records, the budget."""

    def __init__(
        self, t: Tuning, home: Path, say: Callable[[str], None], timeout_s: float,
        before: records.TuneManifest | None = None,
    ) -> None:  # fmt: skip
        self.t, self.home, self.say, self.timeout_s = t, home, say, timeout_s
        # a resumed tune's trials, by name: what each changed (its run is reused if it finished)
        self.before = {x.name: x.changed for x in before.trials} if before else {}
        self.search = Search(list(t.knobs))
        self.left_out: list[records.TuneTrial] = []
        self.running: records.TuneTrial | None = None  # the trial started and not yet ended
        self.started = time.monotonic()
        self.spent_before = before.spent_s if before else 0.0  # a resumed tune's budget goes on

    @property
    def over_budget(self) -> bool:
        return self.spent_s >= 60 * self.t.cfg.tune.budget_min

    @property
    def spent_s(self) -> float:
        """Seconds of tuning so far, over every invocation of this tune."""
        return self.spent_before + time.monotonic() - self.started

    def run(self) -> Tuned:
        """The trials, with the launcher holding their resources throughout (on SLURM one
        allocation, each trial a job step of it: one wait in the queue)."""
        self.write()  # a tune directory from the start (status, cancel, --resume find it)
        with self.t.launcher.held(
            trial_shape(self.t, self.home),
            self.home / records.ALLOCATION,
            self.t.cfg.tune.budget_min,
            self.say,
        ):
            self.trial(self.t.base, math.nan)
            if self.search.best is None:
                raise HpctrainError(f"the config as given failed its trial: see {self.home / 'trial-0'}")
            while (knob := next_knob(self.search)) is not None:
                self.round(knob)
        return self.finish()

    def round(self, knob: Knob) -> None:
        """The knob's other values, each predicted again just before it would run (from every
        trial so far, this round's included)."""
        best = self.search.best
        start = dict(best.settings).get(knob.key) if best else None
        self.search.done.append(knob.key)
        for value in [override_text(v) for v in knob.values if override_text(v) != start]:
            c = candidate(self.search, knob, value)
            if c.pruned:
                self.leave_out(c, f"pruned: {c.pruned}")
            elif refused := self.refused(c.settings):
                self.leave_out(c, f"refused: {refused}")
            elif self.over_budget:
                self.leave_out(c, f"not run: past the budget of {self.t.cfg.tune.budget_min:g} min")
            else:
                self.trial(c.settings, c.predicted_s, knob.key)

    def refused(self, settings: Settings) -> str:
        """Why the config's rules refuse these values together ("": they do not). Each was
        checked alone before the tune; a combination (one micro-batch with 1F1B) may not hold."""
        try:
            prepare([*self.t.overrides, *changed(self.t.base, settings)], self.t.config_dir)
        except ConfigError as e:
            return f"{e.problems[0].key}: {e.problems[0].rule}"
        return ""

    def leave_out(self, c: Candidate, why: str) -> None:
        self.left_out.append(
            records.TuneTrial("", changed(self.t.base, c.settings), c.predicted_s, verdict=why)
        )
        self.write()

    def trial(self, settings: Settings, predicted_s: float, knob: str = "") -> None:
        name = f"trial-{len(self.search.trials)}"
        run_dir = self.home / name
        extra = changed(self.t.base, settings)
        summary, error = self.finished(run_dir, extra), ""
        if summary is None:
            keep_aside(run_dir)
            guess = f" (predicted {1e3 * predicted_s:.2f} ms)" if math.isfinite(predicted_s) else ""
            self.say(f"{name}: {' '.join(extra) or 'the config as given'}{guess}")
            self.running = records.TuneTrial(name, extra, predicted_s, verdict="running")
            self.write()
            summary, error = self.run_trial(run_dir, extra)
            self.running = None
        self.search.trials.append(Trial(name, settings, summary, predicted_s, error, knob))
        self.write()

    def finished(self, run_dir: Path, extra: list[str]) -> records.RunSummary | None:
        """A trial of these settings that finished before (a resumed tune), else None."""
        if self.before.get(run_dir.name) != extra:
            return None
        try:
            return records.read(run_dir / records.SUMMARY, records.RunSummary)
        except RecordError:
            return None

    def run_trial(self, run_dir: Path, extra: list[str]) -> tuple[records.RunSummary | None, str]:
        overrides = [*self.t.overrides, *extra]
        try:  # each value was valid alone; a combination of them may not be (refused: a result)
            prep = prepare([*overrides, f"run.dir={run_dir}"], self.t.config_dir)
            cfg = probe_config(prep.runs[0].cfg, run_dir)
            run_and_wait(self.t.launcher, cfg, run_dir, overrides, self.timeout_s)
            return records.read(run_dir / records.SUMMARY, records.RunSummary), ""
        except (RunCancelled, LaunchError) as e:  # cancelled, or the cluster cannot run it: the tune stops
            if self.running is not None:
                self.running = dataclasses.replace(self.running, verdict=f"stopped: {e}")
                self.write()
            resume = f"; the tune stopped (hpctrain tune --resume {self.home} runs this trial again)"
            raise type(e)(f"{e}{resume}") from e
        except (HpctrainError, RecordError) as e:  # a setting that fails is a result too
            self.say(f"{run_dir.name} failed: {e}")
            return None, str(e).splitlines()[0] if str(e) else type(e).__name__

    def manifest(self, finished: bool = False) -> records.TuneManifest:
        best = self.search.best
        trials = [
            records.TuneTrial(
                t.name,
                changed(self.t.base, t.settings),
                t.predicted_s,
                t.step_s if t.summary else math.nan,
                t.summary.throughput_samples_per_s if t.summary else math.nan,
                verdict(self.search, t),
            )
            for t in self.search.trials
        ] + ([self.running] if self.running else [])
        return records.new(
            records.TuneManifest,
            launcher=self.t.launcher.name,
            overrides=self.t.overrides,
            config_dir=self.t.config_dir,
            trials=trials,
            left_out=self.left_out,
            best=changed(self.t.base, best.settings) if best else [],
            best_trial=best.name if best else "",
            finished=finished,
            spent_s=self.spent_s,
        )

    def write(self, finished: bool = False) -> records.TuneManifest:
        m = self.manifest(finished)
        records.write(self.home / records.TUNE, m)
        return m

    def finish(self) -> Tuned:
        m = self.write(finished=True)
        best = [o for o in self.t.overrides if not o.startswith(("tune.", "run."))] + m.best
        head = f"# hpctrain tune {self.home}: the best of {len(m.trials)} trial(s), {m.best_trial}\n"
        records.write_atomic(self.home / records.BEST, head + yaml.safe_dump(best, default_flow_style=False))
        est, why = self.predicted(self.home / m.best_trial, m.best)
        return Tuned(self.t, self.home, m, est, why)

    def predicted(self, best_dir: Path, best: list[str]) -> tuple[PointEstimate | None, str]:
        """The best settings at tune.target_ranks, from the best trial's own step model."""
        cfg = load_config([*self.t.overrides, *best], self.t.config_dir)
        cfg = target_config(cfg)
        plan = self.t.launcher.plan(cfg, self.home / "target")
        label = f"best at {plan.world_size} ranks"
        try:
            return estimate_point(from_run(best_dir), target_of(Point(label, cfg, plan))), ""
        except (NoEstimate, RecordError) as e:
            return None, str(e)


def read_tune(home: Path) -> records.TuneManifest:
    if not (home / records.TUNE).is_file():
        raise RecordError(f"{home} is not a tune directory (no {records.TUNE})")
    return records.read(home / records.TUNE, records.TuneManifest)


def tune(
    overrides: Sequence[str], config_dir: str | None, say: Callable[[str], None], timeout_s: float = 3600
) -> Tuned:
    t = plan_tune(overrides, config_dir)
    home = create_tune(t)
    say(f"tune: {len(t.knobs)} setting(s) to search -> {home}")
    with tune_lock(home):
        return Tuner(t, home, say, timeout_s).run()


def resume_tune(home: Path, say: Callable[[str], None], timeout_s: float = 3600) -> Tuned:
    read_tune(home)  # a tune directory, before a lock file is made in it
    with tune_lock(home):  # before anything of the tune is read for going on, or renamed
        m = read_tune(home)
        t = plan_tune(m.overrides, m.config_dir)
        return Tuner(t, home, say, timeout_s, m).run()


def tune_lock(home: Path) -> AbstractContextManager[None]:
    """One hpctrain at a time runs a tune (lock.py): a second --resume would set the first's
    running trials aside and run trials beside them."""
    return writer_lock(home, "tune", f"hpctrain tune --resume {home}")
