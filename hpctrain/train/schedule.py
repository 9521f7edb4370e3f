"""Learning-rate scaling with the global batch, and linear warm-up. Pure functions."""
from __future__ import annotations

from ..config.schema import OptimConf


def target_lr(cfg: OptimConf, global_batch: int, per_rank_batch: int) -> float:
    """Linear scaling rule: lr x global_batch / reference_batch (Goyal et al. 2017, arXiv:1706.02677)."""
    if cfg.lr_scaling == "none":
        return cfg.lr
    reference = cfg.reference_batch or per_rank_batch
    return cfg.lr * global_batch / reference


def lr_at(step: int, cfg: OptimConf, target: float) -> float:
    """Gradual warm-up from cfg.lr to `target` over cfg.warmup_steps steps (Goyal et al. 2017, §2.2)."""
    if step >= cfg.warmup_steps or cfg.warmup_steps == 0:
        return target
    return cfg.lr + (target - cfg.lr) * step / cfg.warmup_steps
