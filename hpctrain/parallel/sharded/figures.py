"""Sharded data parallelism's record part (records/parts.py): the ranks one shard group spans."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar


@dataclass(frozen=True)
class ShardFigures:
    """Sharded data parallelism (fsdp/hsdp): ranks one shard group spans."""

    KEY: ClassVar[str] = "shards"
    SHARDS_REPLICAS: ClassVar[bool] = True  # records/parts.py: shard_degree
    FLAT: ClassVar[Mapping[str, str]] = {"shard_degree": "degree"}

    degree: int = 0

    @classmethod
    def measured(cls, declared: Mapping[str, Any], per_rank: Sequence[Any], step_s: float) -> ShardFigures:
        return cls(**declared)


PARTS = (ShardFigures,)
