"""Quantities derived from a config, computed in this one place: below both the plan (which
records them in plan.json) and the rank (which reads them from there)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from hpctrain.config.layout import PIPELINED, layout_for
from hpctrain.config.schema import Config, OptimConf
from hpctrain.records import Batch


def world_size(cfg: Config) -> int:
    """Ranks the launcher starts, as its cluster config counts them."""
    return int(cfg.cluster.world_size)


def replicas(cfg: Config, world: int | None = None) -> int:
    """Data-parallel copies of the model: the world size, or world / stages for a pipeline."""
    return layout_for(cfg, world_size(cfg) if world is None else world).replicas


def resolve_batch(cfg: Config, world: int | None = None) -> Batch:
    """Per-replica and global batch from whichever of the two the user set (validated first). A
    replica is a rank in data parallelism, a whole pipeline otherwise; its batch is cut into
    backward_passes_per_step (data) or microbatches (pipeline) micro-batches."""
    n = replicas(cfg, world)
    per = cfg.train.batch_per_rank
    if per is None:
        per = (cfg.train.global_batch or 0) // max(n, 1)
    par = cfg.parallelism
    cuts = par.microbatches if par.name in PIPELINED else par.backward_passes_per_step
    return Batch(per, per * n, per // max(cuts, 1))


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


def derive(cfg: Config) -> Derived:
    n = world_size(cfg)
    batch = resolve_batch(cfg, n)
    return Derived(n, batch, target_lr(cfg.optim, batch.global_, batch.per_rank))


def default_run_dir(cfg: Config, now: datetime) -> Path:
    """Hydra's layout: <output_root>/<date>/<time>-<name>."""
    if cfg.run.dir:
        return Path(cfg.run.dir)
    return Path(cfg.run.output_root) / now.strftime("%Y-%m-%d") / f"{now.strftime('%H-%M-%S')}-{cfg.run.name}"
