"""The rules of cluster.preflight (the check before training, train/preflight.py) and of the node
names that reach sbatch (cluster.exclude, cluster.nodelist) or pick a node to slow
(debug.slow_node). Each problem names the key, the rule and the fix."""

from __future__ import annotations

import re
import socket
from dataclasses import fields
from pathlib import Path

from hpctrain.analysis.preflight import reference_of
from hpctrain.config.cluster import PreflightConf
from hpctrain.config.schema import Config
from hpctrain.errors import Problem
from hpctrain.records.preflight import reference_checks

HOST = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")  # a node name as SLURM and hostname(1) spell it


def preflight_problems(cfg: Config) -> list[Problem]:
    """cluster.preflight's numbers, and the node names that reach sbatch (cluster.exclude) or
    pick a node to slow (debug.slow_node)."""
    pf, p = cfg.cluster.preflight, []
    if not 0 < pf.tolerance < 1:
        p.append(Problem("cluster.preflight.tolerance", f"must be in (0, 1) (got {pf.tolerance:g})",
                         "set cluster.preflight.tolerance=0.5: a node may be half as fast as the median"))  # fmt: skip
    for key in ("min_tflops", "min_link_gbps"):
        value = getattr(pf, key)
        if value is not None and not value > 0:
            p.append(
                Problem(
                    f"cluster.preflight.{key}",
                    f"must be > 0 (got {value:g})",
                    "drop it, or give a positive reference",
                )
            )
    if pf.only and not pf.enabled:
        p.append(
            Problem(
                "cluster.preflight.only",
                "stops after a check that cluster.preflight.enabled=false does not run",
                "run hpctrain preflight, or set cluster.preflight.enabled=true",
            )
        )
    if pf.max_resubmits < 0:
        p.append(
            Problem(
                "cluster.preflight.max_resubmits", f"must be >= 0 (got {pf.max_resubmits})", "set it to 2"
            )
        )
    names = [("debug.slow_node", cfg.debug.slow_node)] if cfg.debug.slow_node is not None else []
    for key in ("exclude", "nodelist"):
        names += [(f"cluster.{key}[{i}]", n) for i, n in enumerate(getattr(cfg.cluster, key, []))]
    for key, name in names:
        if not HOST.fullmatch(str(name)):
            p.append(
                Problem(
                    key,
                    f"{name!r} is not a node name (letters, digits, '.', '_', '-')",
                    "give a node name such as n2",
                )
            )
    return p + _unread(cfg) + _reference_problems(cfg)


def _unread(cfg: Config) -> list[Problem]:
    """Settings nothing would read: the check's own while it is off, and a node to slow on a run
    that has no such node (a local run's one node is this host)."""
    pf, p = cfg.cluster.preflight, []
    if not pf.enabled:
        default = PreflightConf()
        for f in fields(PreflightConf):
            if f.name not in ("enabled", "only") and getattr(pf, f.name) != getattr(default, f.name):
                p.append(
                    Problem(
                        f"cluster.preflight.{f.name}",
                        "is read by the pre-flight check, which is off: it would do nothing",
                        "set cluster.preflight.enabled=true, or drop it",
                    )
                )
    node = cfg.debug.slow_node
    if node is not None and not cfg.cluster.loses_nodes and node != socket.gethostname():
        p.append(
            Problem(
                "debug.slow_node",
                f"{node!r} is not a node of this run: a local run's one node is {socket.gethostname()}",
                "name this host, or use it with cluster=slurm",
            )
        )
    return p


def _reference_problems(cfg: Config) -> list[Problem]:
    """cluster.preflight.reference: an earlier run or study of the same config that checked its
    nodes, at the same precision, with a good node to hold this job's nodes to."""
    pf, key = cfg.cluster.preflight, "cluster.preflight.reference"
    if pf.reference is None:
        return []
    if not pf.enabled:
        return [Problem(key, "only acts with cluster.preflight.enabled=true", f"set it, or drop {key}")]
    path = Path(pf.reference)
    found = reference_checks(path) if path.is_dir() else []
    if not found:
        return [
            Problem(
                key,
                f"{pf.reference} holds no pre-flight check (preflight.json, or one in each run of a study)",
                "give a run or study directory that ran with cluster.preflight.enabled=true",
            )
        ]
    other = sorted(
        {str(c.get("precision")) for c in found if c.get("precision") not in (None, cfg.precision.name)}
    )
    if other:
        return [
            Problem(
                key,
                f"was checked at precision {', '.join(other)}, this run computes in {cfg.precision.name}",
                "give a run or study of the same config",
            )
        ]
    if reference_of(found, pf.reference) is None:
        return [
            Problem(key, f"{pf.reference} has no node its checks judged good", "give another run or study")
        ]
    return []
