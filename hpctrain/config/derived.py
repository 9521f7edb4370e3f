"""Quantities derived from a config alone, below both the plan (which records them in plan.json)
and the rank (which reads them from there). What depends on the parallelism (the layout, the
batch per replica) is derived by parallel/registry.py:derive."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from hpctrain.config.schema import Config, OptimConf
from hpctrain.records import Batch, Layout


def world_size(cfg: Config) -> int:
    """Ranks the launcher starts, as its cluster config counts them."""
    return int(cfg.cluster.world_size)


def target_lr(cfg: OptimConf, global_batch: int, per_rank_batch: int) -> float:
    """Linear scaling rule: lr x global_batch / reference_batch (Goyal et al. 2017, arXiv:1706.02677)."""
    if cfg.lr_scaling == "none":
        return cfg.lr
    reference = cfg.reference_batch or per_rank_batch
    return cfg.lr * global_batch / reference


@dataclass(frozen=True)
class Derived:
    world_size: int
    batch: Batch
    lr: float  # learning rate after scaling, reached at the end of warm-up
    layout: Layout = Layout()  # which rank holds which part of the model


def default_run_dir(cfg: Config, now: datetime) -> Path:
    """Hydra's layout: <output_root>/<date>/<time>-<name>."""
    if cfg.run.dir:
        return Path(cfg.run.dir)
    return Path(cfg.run.output_root) / now.strftime("%Y-%m-%d") / f"{now.strftime('%H-%M-%S')}-{cfg.run.name}"
