"""A pipeline run's roofline: what its step spends beside compute (idle time waiting for a
neighbour, transfers, the schedule's own overhead), what the link predicts for its bytes, which of
the three bounds it, and the setting that would help. Pure, on the run summary."""

from __future__ import annotations

from dataclasses import dataclass

from hpctrain.analysis.metrics import pipeline_bubble
from hpctrain.records import RunSummary


@dataclass(frozen=True)
class PipeRoof:
    microbatches: int
    bytes_per_microbatch: float  # activations and gradients a rank sends and receives, per micro-batch
    link_s: float  # what the link's alpha-beta predicts per step for those bytes (one message each way)
    idle_s: float
    transfer_s: float
    schedule_s: float
    compute_s: float
    theory: float  # the schedule's bubble share with equal stages
    bound: str  # "bubble" | "transfers" | "schedule overhead" | "compute"
    knob: str

    @property
    def overhead_per_microbatch_s(self) -> float:
        return self.schedule_s / self.microbatches


def theory(s: RunSummary, microbatches: int | None = None) -> float:
    """The run's schedule's idle share with equal stages (at another micro-batch count if given)."""
    m = s.microbatches if microbatches is None else microbatches
    return pipeline_bubble(s.stages, m, s.schedule, s.pieces_per_rank)


def for_pipeline(s: RunSummary) -> PipeRoof | None:
    """None for a run without stages (or without the parts: recorded before they were measured)."""
    if s.stages < 2 or not (s.transfer_s or s.schedule_s):
        return None
    m = max(s.microbatches, 1)
    per_mb = s.p2p_bytes / m
    # each micro-batch: activations forward and gradients back, one message each per neighbour
    link = 2 * m * (s.p2p_alpha_s + s.p2p_beta_s_per_byte * per_mb / 2)
    parts = {"bubble": s.bubble_s, "transfers": s.transfer_s, "schedule overhead": s.schedule_s}
    bound = max(parts, key=lambda k: parts[k])
    if s.compute_s >= sum(parts.values()):  # the three together cost less than the compute
        bound = "compute"
    return PipeRoof(
        m, per_mb, link, s.bubble_s, s.transfer_s, s.schedule_s, s.compute_s,
        theory(s), bound, _knob(s, bound, m),
    )  # fmt: skip


def _knob(s: RunSummary, bound: str, m: int) -> str:
    if bound == "bubble":
        share, expected = s.bubble_share, theory(s)
        if expected == 0:
            return (
                f"{s.schedule} idles only when the forward, input- and weight-gradient passes differ "
                "in time: balance the stages (parallelism.split_at), or check for a slow rank"
            )
        if share > 1.25 * expected:
            return (
                f"the stages idle {share / expected:.1f}x what {s.schedule} predicts at m={m}: balance "
                "the stages (parallelism.split_at) or check for a slow rank"
            )
        return (
            f"more micro-batches (m={2 * m}: theory {100 * theory(s, 2 * m):.0f}% idle), "
            "or a schedule that idles less (interleaved_1f1b, interleaved_zb, zbv)"
        )
    if bound == "transfers":
        return "fewer stages (more layers per stage) or larger micro-batches: each moves its activations"
    if bound == "schedule overhead":
        per = 1e3 * s.schedule_s / m
        return f"fewer, larger micro-batches: each costs {per:.2f} ms of schedule overhead"
    return "idle time, transfers and schedule overhead together cost less than the compute"
