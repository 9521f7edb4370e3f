"""parallelism.cp.*: context parallelism's settings, added to the schema's parallelism group by
name (config/schema.py: with_dimension_settings); nothing here imports hpctrain."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, cast


@dataclass
class ContextParallelSettings:
    """parallelism.cp: each sample's sequence split over a group of ranks, attention seeing all of
    it (the K/V of the group exchanged in every attention call); with parallelism=data, fsdp or
    hsdp (parallelism.stages too), and tensor parallelism inside it."""

    degree: int = 1  # ranks one sample's sequence is split over; 1 = off
    # the module whose input (batch, sequence, ...) each rank takes its share of, and whose
    # attention calls (F.scaled_dot_product_attention) see the whole sequence; null = the built-in
    # transformer's first block (blocks.layers.0); a GPT-2 style model: transformer.h.0
    split_at: str | None = None


@dataclass
class ContextHolder:
    label: ClassVar[str] = "context-parallel"
    cp: ContextParallelSettings = field(default_factory=ContextParallelSettings)


HOLDER = ContextHolder


def cp_settings(cfg: Any) -> ContextParallelSettings:
    """The config's parallelism.cp (typed: the schema holds it by name)."""
    return cast(ContextParallelSettings, cfg.parallelism.cp)
