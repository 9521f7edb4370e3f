"""Launchers by name, as ReFrame registers its launchers: the config's `cluster.name` picks one.
One Registry (hpctrain/registry.py) as for engines and parallelisms: a name maps to
"module:Class", imported on first use; another installed package adds one through an entry point
in `hpctrain.launchers`.

Adding a launcher (say Flux): a schema dataclass in config/schema.py (CLUSTER_SCHEMAS), a YAML
file conf/cluster/flux.yaml, and a package hpctrain/launch/flux/ whose launcher class implements
launch.base.Launcher, named in LAUNCHERS below. Nothing else changes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hpctrain import records
from hpctrain.config.schema import Config
from hpctrain.errors import ConfigError, HpctrainError
from hpctrain.launch.base import Job, Launcher
from hpctrain.registry import Registry

LAUNCHERS: Registry[Launcher[Any]] = Registry(
    "launcher",
    {
        "local": "hpctrain.launch.local.launcher:LocalLauncher",
        "slurm": "hpctrain.launch.slurm.launcher:SlurmLauncher",
    },
    group="hpctrain.launchers",
    base="hpctrain.launch.base:Launcher",
)


def launcher_class(name: str) -> type[Launcher[Any]]:
    """The launcher registered as `name`; ConfigError naming `cluster` when there is none."""
    return LAUNCHERS.get(name, "cluster")


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
