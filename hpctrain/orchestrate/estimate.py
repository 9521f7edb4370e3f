"""`--estimate` for a run, a sweep or a study: the evidence each point stands on (an earlier run
or study the user names, or else, where a run costs seconds, a short probe of each distinct
point), and each point's estimate (analysis/estimate.py). Nothing is submitted; probes run in a
temporary directory that is removed afterwards, unless a probe failed (its error names it)."""

from __future__ import annotations

import dataclasses
import math
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from hpctrain.analysis.estimate import Evidence, NoEstimate, PointEstimate, Target, estimate_point
from hpctrain.analysis.evidence import evidence_from, from_run
from hpctrain.analysis.memory import Limit, Prediction
from hpctrain.config import to_yaml
from hpctrain.config.schema import Config
from hpctrain.errors import ConfigError, HpctrainError, Problem
from hpctrain.launch.base import Launcher
from hpctrain.orchestrate.probe import run_and_wait
from hpctrain.orchestrate.runs import point_labels, prepare
from hpctrain.orchestrate.study_run import plan_study
from hpctrain.orchestrate.validate import memory_key, trains
from hpctrain.records import RankPlan

PROBE_WARMUP = 2  # warm-up steps a probe runs at most (their mean is all it needs)
# timed steps a probe runs: a tenth of the run's, within these bounds. Steps keep getting faster
# for hundreds of steps after the warm-up (allocator, caches, the collectives' connections): on
# this machine a 2,000-step run's steps settled at 2.4 ms, its first 40 took 3.5 ms, and probes of
# 8 steps overestimated such runs by 60 to 160% (`hpctrain bench estimate --steps 2000`)
PROBE_TIMED = (20, 200)


@dataclass(frozen=True)
class Point:
    label: str
    cfg: Config
    plan: RankPlan


@dataclass(frozen=True)
class Estimates:
    points: list[PointEstimate]
    refused: list[str]  # the points the evidence cannot speak for, and why


def target_of(p: Point) -> Target:
    threads = int(p.plan.env.get("OMP_NUM_THREADS", "1") or 1)
    limit_min = getattr(p.cfg.cluster, "time_min", None)
    return Target(
        p.label,
        p.plan.world_size,
        p.plan.nodes,
        # as the summary counts it (train/stats.py): samples per rank, whatever the layout (a
        # tensor-parallel group or a pipeline's stages share one replica's)
        p.plan.batch.global_ / p.plan.world_size,
        threads,
        p.cfg.train.steps,
        p.cfg.train.warmup_steps,
        p.plan.world_size * threads,
        60.0 * limit_min if limit_min else math.inf,
        getattr(p.cfg.cluster, "max_requeues", 0) > 0,
    )


def probe_length(steps: int, warmup_steps: int) -> tuple[int, int]:
    """(warm-up, timed) steps of the probe for a run of `steps`."""
    return min(warmup_steps, PROBE_WARMUP), min(max(steps // 10, PROBE_TIMED[0]), PROBE_TIMED[1], steps)


def probe_config(cfg: Config, run_dir: Path) -> Config:
    """`cfg` as a short probe: a few warm-up and timed steps, no checkpoints, no tracking, no
    profiler, a fresh start."""
    warm, timed = probe_length(cfg.train.steps, cfg.train.warmup_steps)
    train = dataclasses.replace(cfg.train, steps=warm + timed, warmup_steps=warm, resume_from=None)
    return dataclasses.replace(
        cfg,
        train=train,
        cluster=dataclasses.replace(cfg.cluster, checkpoint_interval=0),
        tracking=dataclasses.replace(cfg.tracking, name="none", mlflow=False, tensorboard=False),
        profile=dataclasses.replace(cfg.profile, enabled=False),
        run=dataclasses.replace(cfg.run, dir=str(run_dir)),
    )


def _key(cfg: Config) -> str:
    """Points whose probes would be the same (repetitions; step counts that give one probe
    length) share one."""
    return to_yaml(probe_config(cfg, Path()))


def check_same(ev: Evidence, cfg: Config) -> None:
    """The evidence must have run what the point runs, or its step says nothing about it."""
    mine = {
        "model": cfg.model._target_ or cfg.model.name,
        "precision": cfg.precision.name,
        "parallelism.engine": str(cfg.parallelism.engine),
        "parallelism": str(cfg.parallelism.name),
    }
    for key, theirs in ev.what:
        if key in mine and theirs != mine[key]:
            raise ConfigError(
                [
                    Problem(
                        "--from",
                        f"{ev.source} ran {key}={theirs}, this point runs {mine[key]}: its steps say "
                        "nothing about this one",
                        "name a run or study of this config, or leave --from out for a probe",
                    )
                ]
            )


def estimate(
    launcher: Launcher,
    points: Sequence[Point],
    source: Path | None,
    say: Callable[[str], None],
    timeout_s: float = 3600,
) -> Estimates:
    """Every point's estimate, from `source` (an earlier run or study) or from probes."""
    if points and points[0].cfg.script.path:
        raise ConfigError.one(
            "script.path",
            "a script's steps are its own; --estimate times hpctrain's trainer",
            "drop --estimate",
        )
    if source is not None:
        ev = evidence_from(source)
        for p in points:
            check_same(ev, p.cfg)
        return _estimated(points, [ev] * len(points))
    if not points or not points[0].cfg.cluster.probes_for_estimates:
        raise HpctrainError(
            f"an estimate for cluster={points[0].cfg.cluster.name if points else '?'} stands on a run "
            "on that cluster, and probing would submit one: name an earlier run or study of this "
            "config with --from DIR (a short run does: the same overrides with train.steps=20)"
        )
    probes: dict[str, Evidence] = {}
    keys = [_key(p.cfg) for p in points]
    tmp = Path(tempfile.mkdtemp(prefix="hpctrain-estimate-"))
    for p, key in zip(points, keys):
        if key in probes:
            continue
        run_dir = tmp / f"probe-{len(probes)}"
        cfg = probe_config(p.cfg, run_dir)
        say(
            f"probe {len(probes) + 1}: {p.label or 'the run'}: {cfg.train.steps} steps on {p.plan.world_size} rank(s)"
        )
        try:
            run_and_wait(launcher, cfg, run_dir, [], timeout_s)
        except HpctrainError:
            say(f"the failed probe's records are kept in {run_dir}")  # the error names them
            raise
        probes[key] = dataclasses.replace(from_run(run_dir), source=f"a {cfg.train.steps}-step probe")
    shutil.rmtree(tmp, ignore_errors=True)  # only when every probe finished: a failed one is kept
    return _estimated(points, [probes[key] for key in keys])


def _estimated(points: Sequence[Point], evidence: Sequence[Evidence]) -> Estimates:
    """Each point's estimate from its evidence (in the same order)."""
    found, refused = [], []
    for p, ev in zip(points, evidence):
        try:
            found.append(estimate_point(ev, target_of(p)))
        except NoEstimate as e:
            refused.append(str(e))
    if not found:
        raise HpctrainError("no estimate: " + "; ".join(refused))
    return Estimates(found, refused)


@dataclass(frozen=True)
class MemoryRow:
    """A point's predicted memory per rank and what each rank has (None: nothing says), or why it
    was not predicted."""

    label: str
    prediction: Prediction | None
    limit: Limit | None
    why_not: str = ""


def memory_of(launcher: Launcher, points: Sequence[Point], say: Callable[[str], None]) -> list[MemoryRow]:
    """Every point's predicted peak memory per rank (memory/predict.py); identical points (a
    study's repetitions) are traced once."""
    from hpctrain.memory.predict import predict
    from hpctrain.memory.trace import TraceError

    done: dict[str, Prediction] = {}
    rows = []
    for p in points:
        limit = launcher.memory_per_rank(p.cfg)
        if not trains(p.cfg):
            rows.append(MemoryRow(p.label, None, limit, "runs no hpctrain trainer"))
            continue
        key = memory_key(p.cfg)
        try:
            if key not in done:
                say(f"memory: tracing {p.label or 'the run'}")
                done[key] = predict(p.cfg, launcher.on_gpus(p.cfg))
            rows.append(MemoryRow(p.label, done[key], limit))
        except TraceError as e:
            rows.append(MemoryRow(p.label, None, limit, str(e)))
    return rows


def run_points(
    overrides: Sequence[str], config_dir: str | None, multirun: bool
) -> tuple[Launcher, list[Point]]:
    """The points of `hpctrain run` (one, or a sweep's), planned and validated, nothing created."""
    prep = prepare(overrides, config_dir, multirun, memory=False)
    labels = point_labels([r.overrides for r in prep.runs]) if prep.group_dir else ["the run"]
    return prep.launcher, [Point(label, r.cfg, r.plan) for label, r in zip(labels, prep.runs)]


def study_points(kind: str, overrides: Sequence[str], config_dir: str | None) -> tuple[Launcher, list[Point]]:
    """The runs of `hpctrain study KIND`, planned and validated, nothing created."""
    s = plan_study(kind, overrides, config_dir, memory=False)
    runs = zip(s.manifest.runs, s.configs)
    return s.launcher, [Point(r.name, c, s.launcher.plan(c, Path(r.run_dir))) for r, c in runs]
