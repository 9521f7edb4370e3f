"""Pipeline schedules: what each needs of the layout (torch.distributed.pipelining's class, the
model pieces per rank, whether it splits the backward), its rules and its bubble. The one table
every layer asks (config rules, the ranks' build, the analysis); no code outside it compares a
schedule's name."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ScheduleKind:
    """What a pipeline schedule needs: torch.distributed.pipelining's class, model pieces per rank
    ("one", "virtual" = parallelism.virtual_stages, or "two" in a V), whether it splits the
    backward into input and weight gradients (zero bubble), and the least virtual_stages."""

    torch_class: str
    pieces: str = "one"
    split_backward: bool = False
    min_virtual: int = 1
    # keeps one micro-batch in flight per stage from the start: needs micro-batches >= stages
    one_in_flight_per_stage: bool = False
    forwards_first: bool = False  # every micro-batch's forward before any backward (GPipe)

    def in_flight(self, stages: int, microbatches: int, stage: int) -> int:
        """Micro-batches whose activations a stage holds at its peak: GPipe runs every forward
        before any backward; the 1F1B family starts `stages - stage` forwards before its first
        backward (Narayanan et al. 2021, 2.2: PipeDream-Flush's warm-up), at most all of them."""
        if self.forwards_first:
            return microbatches
        return max(1, min(microbatches, stages - stage))

    @property
    def multi(self) -> bool:
        """Runs several stages per rank (a runtime schedule: takes a list of stages)."""
        return self.pieces != "one" or self.split_backward

    def bubble(self, stages: int, microbatches: int, pieces: int = 1) -> float:
        """Idle share of a step with equal stages, p stages, m micro-batches, v pieces per rank:
        GPipe and 1F1B (p - 1)/(m + p - 1) (Huang et al. 2019, GPipe; Narayanan et al. 2021, 2.2);
        interleaved 1F1B (p - 1)/(v m + p - 1) (Narayanan et al. 2021, 2.2.2: the bubble divided
        by v); zero bubble with forward, input- and weight-gradient passes of equal time T: looped
        ZB-H1 idles (p - 1)T against 3T of work per micro-batch, so (p - 1)/(3 v m + p - 1), and
        ZB-V idles 0 (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", sections 3 and 6)."""
        if self.pieces == "two":
            return 0.0
        p, m = stages, microbatches
        v = max(pieces, 1) if self.pieces == "virtual" else 1
        work = 3 if self.split_backward else 1  # passes a micro-batch's backward is cut into, plus one
        return (p - 1) / (work * v * m + p - 1)


SCHEDULES = {
    "gpipe": ScheduleKind("ScheduleGPipe", forwards_first=True),
    "1f1b": ScheduleKind("Schedule1F1B", one_in_flight_per_stage=True),
    "interleaved_1f1b": ScheduleKind("ScheduleInterleaved1F1B", "virtual", min_virtual=2),
    "interleaved_zb": ScheduleKind("ScheduleInterleavedZeroBubble", "virtual", split_backward=True),
    "zbv": ScheduleKind("ScheduleZBVZeroBubble", "two", split_backward=True),
}
