"""Learning-rate warm-up. Pure functions; the scaled target lr is derived once (derived.py)."""

from __future__ import annotations

from hpctrain.config.derived import target_lr
from hpctrain.config.schema import OptimConf

__all__ = ["lr_at", "target_lr"]


def lr_at(step: int, cfg: OptimConf, target: float) -> float:
    """Gradual warm-up from cfg.lr to `target` over cfg.warmup_steps steps (Goyal et al. 2017, §2.2)."""
    if step >= cfg.warmup_steps or cfg.warmup_steps == 0:
        return target
    return cfg.lr + (target - cfg.lr) * step / cfg.warmup_steps
