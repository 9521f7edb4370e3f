"""The pipeline's records (hpctrain/records/parts.py): what one rank measured in one step
(PipelineStep), one rank's figures (PipelineRank) and the run's (PipelineFigures), each under the
part key "pipeline". records/parts.py's readers import this module on first use (PARTS, named by
hpctrain/dimension_packages.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import fmean
from typing import Any, ClassVar

from hpctrain.records.parts import part, share


# --- the pipeline --------------------------------------------------------------------------------
@dataclass(frozen=True)
class PipelineStep:
    """One pipeline step of one rank: idle waiting for a neighbouring stage to send (the bubble),
    waiting for the bytes to move, the schedule's own overhead, bytes sent + received, and the
    schedule's wall time (its compute, idle, transfers and overhead)."""

    KEY: ClassVar[str] = "pipeline"
    LEVEL: ClassVar[str] = "step"
    FLAT: ClassVar[Mapping[str, str]] = {
        k: k for k in "bubble_s transfer_s schedule_s p2p_bytes pipe_s".split()
    }

    bubble_s: float = 0.0
    transfer_s: float = 0.0
    schedule_s: float = 0.0
    p2p_bytes: int = 0
    pipe_s: float = 0.0


@dataclass(frozen=True)
class PipelineRank:
    """A pipeline rank: the stage it holds, its timed steps' means of PipelineStep, and the link
    to its neighbouring stages (alpha + beta * bytes, parallel/pipeline/p2p.py)."""

    KEY: ClassVar[str] = "pipeline"
    LEVEL: ClassVar[str] = "rank"
    FLAT: ClassVar[Mapping[str, str]] = {
        k: k
        for k in "stage bubble_s transfer_s schedule_s p2p_bytes pipe_s p2p_alpha_s p2p_beta_s_per_byte".split()
    }

    stage: int = 0
    bubble_s: float = 0.0
    transfer_s: float = 0.0
    schedule_s: float = 0.0
    p2p_bytes: float = 0.0
    pipe_s: float = 0.0
    p2p_alpha_s: float = 0.0
    p2p_beta_s_per_byte: float = 0.0


@dataclass(frozen=True)
class PipelineFigures:
    """Pipeline stages: the schedule, and per step the means over ranks of PipelineRank's figures."""

    KEY: ClassVar[str] = "pipeline"
    FLAT: ClassVar[Mapping[str, str]] = {
        k: k
        for k in (
            "stages microbatches schedule pieces_per_rank bubble_s bubble_share transfer_s transfer_share "
            "schedule_s schedule_share p2p_bytes pipe_s p2p_alpha_s p2p_beta_s_per_byte"
        ).split()
    }

    stages: int = 1
    microbatches: int = 1
    schedule: str = ""
    pieces_per_rank: int = 1  # model pieces a rank holds (interleaved schedules, zbv)
    bubble_s: float = 0.0
    bubble_share: float = 0.0
    transfer_s: float = 0.0
    transfer_share: float = 0.0
    schedule_s: float = 0.0
    schedule_share: float = 0.0
    p2p_bytes: float = 0.0
    pipe_s: float = 0.0  # the schedule's wall time: what a schedule's theoretical bubble is a share of
    p2p_alpha_s: float = 0.0
    p2p_beta_s_per_byte: float = 0.0

    @classmethod
    def measured(cls, declared: Mapping[str, Any], per_rank: Sequence[Any], step_s: float) -> PipelineFigures:
        ranks = [part(r, PipelineRank) for r in per_rank]

        def avg(k: str) -> float:
            return fmean(getattr(r, k) for r in ranks)

        bubble, transfer, schedule = avg("bubble_s"), avg("transfer_s"), avg("schedule_s")
        return cls(
            **declared,
            bubble_s=bubble,
            bubble_share=share(bubble, step_s),
            transfer_s=transfer,
            transfer_share=share(transfer, step_s),
            schedule_s=schedule,
            schedule_share=share(schedule, step_s),
            p2p_bytes=avg("p2p_bytes"),
            pipe_s=avg("pipe_s"),
            p2p_alpha_s=avg("p2p_alpha_s"),
            p2p_beta_s_per_byte=avg("p2p_beta_s_per_byte"),
        )

    def mesh_dim(self) -> tuple[bool, int, str] | None:
        """(outside the replicas, ranks along it, its name in a run's title); None: no stages."""
        return (True, self.stages, f"{self.stages} stages") if self.stages > 1 else None

    @property
    def bubble_of_schedule(self) -> float:
        """Idle share of the schedule's wall time, what a schedule's theory predicts (the step's
        share without the update, data and loss; older records: the step's share)."""
        return self.bubble_s / self.pipe_s if self.pipe_s > 0 else self.bubble_share


PARTS = (PipelineStep, PipelineRank, PipelineFigures)  # what records/parts.py registers, by level
