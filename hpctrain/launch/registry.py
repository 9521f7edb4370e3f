"""Launchers by name, as ReFrame registers its launchers. The config's `cluster.name` picks one.

Adding a launcher (say Flux): a schema dataclass in config/schema.py (CLUSTER_SCHEMAS), a YAML
file conf/cluster/flux.yaml, and a package hpctrain/launch/flux/ whose launcher class implements
launch.base.Launcher and is decorated @register_launcher("flux"). Nothing else changes.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from hpctrain import records
from hpctrain.config.schema import Config
from hpctrain.errors import ConfigError, HpctrainError
from hpctrain.launch.base import Job, Launcher

L = TypeVar("L", bound=type[Launcher])
_LAUNCHERS: dict[str, type[Launcher]] = {}
BUILT_IN = ("local", "slurm")


def register_launcher(name: str) -> Callable[[L], L]:
    def deco(cls: L) -> L:
        cls.name = name
        _LAUNCHERS[name] = cls
        return cls

    return deco


def launcher_class(name: str) -> type[Launcher]:
    """The launcher registered as `name`; its module hpctrain.launch.<name> is imported on first use."""
    if name not in _LAUNCHERS and name.isidentifier():
        try:
            importlib.import_module(f"{__package__}.{name}")
        except ModuleNotFoundError:
            pass
    if name not in _LAUNCHERS:
        raise ConfigError.one("cluster", f"no launcher named {name!r}", f"use one of: {', '.join(BUILT_IN)}")
    return _LAUNCHERS[name]


def launcher_for(cfg: Config) -> Launcher:
    """A launcher for this config, with the host facts it plans and validates against."""
    cls = launcher_class(cfg.cluster.name)
    if not isinstance(cfg.cluster, cls.schema):  # the one place that checks the cluster's type
        raise ConfigError.one(
            "cluster",
            f"cluster.name={cfg.cluster.name} with a {type(cfg.cluster).__name__}",
            f"select the launcher with cluster={cfg.cluster.name}",
        )
    return cls(cls.host_facts())


def load_job(run_dir: Path) -> Job:
    """The job a run directory holds, refused when its job.json names no launcher hpctrain knows."""
    job = Job.load(run_dir)
    try:
        launcher_class(job.ref.launcher)
    except HpctrainError:
        raise records.RecordError(
            f"{run_dir / records.JOB}: names no launcher hpctrain knows ({job.ref.launcher!r})"
        ) from None
    return job
