"""Rules of the tracking and profile settings (config/observe.py): each names the key, the rule
and the fix, before anything starts."""

from __future__ import annotations

import re

from hpctrain.config.observe import ProfileConf
from hpctrain.config.schema import Config
from hpctrain.errors import Problem

URI = re.compile(r"^[a-z][a-z0-9+.-]*://\S+$")
PROFILE_KEYS = ("steps", "ranks", "memory", "record_shapes", "with_stack", "horovod_timeline")


def observe_problems(cfg: Config, world: int) -> list[Problem]:
    return _tracking_problems(cfg) + _profile_problems(cfg, world)


# what each option of the tracking group turns on (conf/tracking/*.yaml)
TRACKERS = {
    "none": (False, False),
    "mlflow": (True, False),
    "tensorboard": (False, True),
    "both": (True, True),
}


def _chosen_trackers(cfg: Config) -> list[Problem]:
    """tracking=none tracking.mlflow=true tracked anyway: a flag that contradicts the option."""
    t = cfg.tracking
    want = TRACKERS.get(t.name)
    if want is None or want == (t.mlflow, t.tensorboard):
        return []
    flags = {"mlflow": t.mlflow, "tensorboard": t.tensorboard}
    key = next(k for k, on, w in zip(flags, flags.values(), want, strict=True) if on != w)
    pick = [n for n, w in TRACKERS.items() if w == (t.mlflow, t.tensorboard)][0]
    return [
        Problem(
            f"tracking.{key}",
            f"={str(flags[key]).lower()} contradicts tracking={t.name}",
            f"choose the option that says what you want: tracking={pick}",
        )
    ]


def _tracking_problems(cfg: Config) -> list[Problem]:
    t, p = cfg.tracking, _chosen_trackers(cfg)
    if p:
        return p
    if not (t.mlflow or t.tensorboard):
        for key in ("uri", "experiment"):
            if getattr(t, key) is not None:
                p.append(
                    Problem(
                        f"tracking.{key}",
                        "does nothing without a tracker",
                        f"add tracking=mlflow (or tracking=both), or drop tracking.{key}",
                    )
                )
        return p
    if t.uri is not None and (problem := uri_problem(t.uri)):
        p.append(
            Problem(
                "tracking.uri",
                problem,
                "give the store's URI, or drop tracking.uri for the default store in run.output_root",
            )
        )
    if t.uri is not None and not t.mlflow:
        p.append(Problem("tracking.uri", "is MLflow's store", "use tracking=mlflow or tracking=both"))
    if t.experiment is not None and not t.experiment.strip():
        p.append(Problem("tracking.experiment", "must not be empty", "name it, or drop it for run.name"))
    return p


def uri_problem(uri: str) -> str | None:
    """What is wrong with an MLflow tracking URI (None: nothing). Whitespace and control
    characters are refused: in a sqlite path they became part of a file's name."""
    if URI.fullmatch(uri) and uri.isprintable():
        return None
    return f"must be a URI such as sqlite:///abs/path/mlflow.db or http://host:5000 (got {uri!r})"


def _profile_problems(cfg: Config, world: int) -> list[Problem]:
    pr, p = cfg.profile, []
    if not pr.enabled:
        default = ProfileConf()
        return [
            Problem(
                f"profile.{k}",
                "does nothing without profile.enabled=true",
                f"add profile.enabled=true or drop profile.{k}",
            )
            for k in PROFILE_KEYS
            if getattr(pr, k) != getattr(default, k)
        ]
    if cfg.script.path:
        p.append(
            Problem(
                "profile.enabled",
                "profiles the built-in trainer's steps; a script's steps are its own",
                "call torch.profiler inside the script, or profile a _target_ model instead",
            )
        )
    p += _window_problems(cfg)
    for r in pr.ranks or []:
        if not 0 <= r < world:
            p.append(
                Problem(
                    "profile.ranks",
                    f"rank {r} is not in [0, {world - 1}]",
                    "list existing ranks, or null for all",
                )
            )
    if pr.ranks is not None and not pr.ranks:
        p.append(Problem("profile.ranks", "is empty", "list the ranks to profile, or null for all"))
    return p


def _window_problems(cfg: Config) -> list[Problem]:
    pr, steps = cfg.profile, cfg.train.steps
    if pr.steps is not None and len(pr.steps) != 2:
        return [
            Problem(
                "profile.steps", f"must be [first, last] (got {list(pr.steps)})", "e.g. profile.steps=[5,7]"
            )
        ]
    first, last = pr.window(cfg.train.warmup_steps)
    if 0 <= first <= last < steps:
        return []
    default = " (the default: the 3 steps after train.warmup_steps)" if pr.steps is None else ""
    return [
        Problem(
            "profile.steps",
            f"the window [{first}, {last}]{default} must lie within the run's steps 0..{steps - 1}, first <= last",
            f"set profile.steps=[first,last] with 0 <= first <= last < {steps}, or raise train.steps",
        )
    ]
