"""Context parallelism's record parts (records/parts.py), by level: what a step exchanged, a
rank's means with the seconds that exchange takes sent again alone, and the run's."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import fmean
from typing import Any, ClassVar

from hpctrain.records.parts import part

KEY = "context"


@dataclass(frozen=True)
class ContextStep:
    """One step's collectives of K and V: each attention call's all-gather of them forward (again
    where its block is recomputed) and the reduce-scatter of their gradients backward (on CUDA, a
    ring's passes counted as these), and the bytes this rank received and sent in them."""

    KEY: ClassVar[str] = KEY
    LEVEL: ClassVar[str] = "step"
    FLAT: ClassVar[Mapping[str, str]] = {}

    exchanges: int = 0
    kv_bytes: float = 0.0


@dataclass(frozen=True)
class ContextRank:
    """A rank's mean exchanges and bytes per step, and their seconds per step when the step's
    exchanges are sent again alone after training (all counted as exposed: the attention waits
    for them)."""

    KEY: ClassVar[str] = KEY
    LEVEL: ClassVar[str] = "rank"
    FLAT: ClassVar[Mapping[str, str]] = {}

    exchanges: float = 0.0
    kv_bytes: float = 0.0
    comm_s: float = 0.0


@dataclass(frozen=True)
class ContextFigures:
    """The run's context parallelism: its degree, where the sequence is split and how (zig-zag:
    rank i of N holds chunks i and 2N-1-i), and the ranks' mean exchange per step."""

    KEY: ClassVar[str] = KEY
    LEVEL: ClassVar[str] = "run"
    FLAT: ClassVar[Mapping[str, str]] = {}

    degree: int = 1
    split_at: str = ""
    scheme: str = "zig-zag"
    exchanges: float = 0.0
    kv_bytes: float = 0.0
    comm_s: float = 0.0
    share: float = 0.0  # of the step

    def mesh_dim(self) -> tuple[bool, int, str] | None:
        """(outside the replicas, ranks along it, its name in a run's title)."""
        return (False, self.degree, f"cp {self.degree}") if self.degree > 1 else None

    @classmethod
    def measured(cls, declared: Mapping[str, Any], per_rank: Sequence[Any], step_s: float) -> ContextFigures:
        ranks = [part(r, ContextRank) for r in per_rank]
        comm = fmean(r.comm_s for r in ranks) if ranks else 0.0
        return cls(
            **declared,
            exchanges=fmean(r.exchanges for r in ranks) if ranks else 0.0,
            kv_bytes=fmean(r.kv_bytes for r in ranks) if ranks else 0.0,
            comm_s=comm,
            share=comm / step_s if step_s > 0 else 0.0,
        )


PARTS = (ContextStep, ContextRank, ContextFigures)
