"""Tensor parallelism's record parts (records/parts.py): a rank's collectives per step and their
seconds replayed alone, and the run's (the degree the plan declared, with the ranks' figures)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import fmean
from typing import Any, ClassVar

from hpctrain.records.parts import part

KEY = "tensor"


@dataclass(frozen=True)
class TensorRank:
    """A tensor-parallel rank: its collectives per step and their bytes, as all-reduce bytes
    (counted on the first warm-up step, comm.py), and their seconds per step sent again
    alone after training (all exposed, though the step's clock counts them as compute)."""

    KEY: ClassVar[str] = KEY
    LEVEL: ClassVar[str] = "rank"
    FLAT: ClassVar[Mapping[str, str]] = {
        "tp_messages": "messages",
        "tp_bytes": "bytes",
        "tp_comm_s": "comm_s",
    }

    messages: int = 0
    bytes: float = 0.0
    comm_s: float = 0.0


@dataclass(frozen=True)
class TensorFigures:
    """Tensor parallelism: ranks per group, its collectives per step (rank 0's: every rank of a
    group sends the same) as all-reduce bytes, and their seconds replayed alone (mean over ranks)."""

    KEY: ClassVar[str] = KEY
    SPLITS_LAYERS: ClassVar[bool] = True  # each rank sends a slice of the gradients (records/parts.py)
    FLAT: ClassVar[Mapping[str, str]] = {
        "tp_degree": "degree",
        "tp_messages": "messages",
        "tp_bytes": "bytes",
        "tp_comm_s": "comm_s",
    }

    degree: int = 1
    messages: int = 0
    bytes: float = 0.0
    comm_s: float = 0.0

    def mesh_dim(self) -> tuple[bool, int, str] | None:
        """(outside the replicas, ranks along it, its name in a run's title); None: no TP."""
        return (False, self.degree, f"tp {self.degree}") if self.degree > 1 else None

    @classmethod
    def measured(cls, declared: Mapping[str, Any], per_rank: Sequence[Any], step_s: float) -> TensorFigures:
        first = part(per_rank[0], TensorRank)
        return cls(
            **declared,
            messages=first.messages,
            bytes=first.bytes,
            comm_s=fmean(part(r, TensorRank).comm_s for r in per_rank),
        )


PARTS = (TensorRank, TensorFigures)
