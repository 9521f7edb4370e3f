"""A pipeline run's roofline: what its step spends beside compute (idle time waiting for a
neighbour, transfers, the schedule's own overhead), what the link predicts for its bytes, which of
the three bounds it, and the setting that would help. Pure, on the run summary."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import fmean

from hpctrain.analysis.metrics import pipeline_bubble
from hpctrain.analysis.study_parts import StudyPart
from hpctrain.parallel.pipeline.figures import PipelineFigures, PipelineRank
from hpctrain.records import RunSummary
from hpctrain.records.parts import part, shard_degree, share
from hpctrain.records.schedules import SCHEDULES


def pipe(s: RunSummary) -> PipelineFigures:
    """The run's pipeline figures (stages 1 and zeros without one)."""
    return part(s, PipelineFigures)


def steady(schedule: str) -> bool:
    """A schedule of one piece per rank and a whole backward (GPipe, 1F1B): its time is the
    stages' compute plus (m - 1) times the slowest's, which the measured-stage models below use."""
    kind = SCHEDULES.get(schedule)
    return kind is not None and not kind.multi


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
    f = pipe(s)
    m = f.microbatches if microbatches is None else microbatches
    return pipeline_bubble(f.stages, m, f.schedule, f.pieces_per_rank)


def stage_compute(s: RunSummary) -> list[float]:
    """Each stage's compute per micro-batch within the schedule (the schedule's wall time less its
    waits and overhead), mean over the stage's replicas; [] for records without the parts."""
    f = pipe(s)
    out = []
    for k in range(f.stages):
        ranks = [f for f in (part(r, PipelineRank) for r in s.per_rank) if f.stage == k and f.pipe_s > 0]
        if not ranks:
            return []
        busy = [r.pipe_s - r.bubble_s - r.transfer_s - r.schedule_s for r in ranks]
        out.append(sum(busy) / len(busy) / max(f.microbatches, 1))
    return out


def theory_measured(s: RunSummary) -> float | None:
    """GPipe's and 1F1B's idle share of the schedule with the stages' measured compute c_s per
    micro-batch instead of equal ones: the schedule takes T = sum c_s + (m - 1) max c_s (the
    slowest stage paces the steady state), stage s idles T - m c_s (the equal-stage case gives
    (p - 1)/(m + p - 1)). None for other schedules, or without the parts."""
    f = pipe(s)
    c = stage_compute(s)
    if not steady(f.schedule) or not c:
        return None
    m = max(f.microbatches, 1)
    t = sum(c) + (m - 1) * max(c)
    return sum(t - m * x for x in c) / len(c) / t if t > 0 else None


def for_pipeline(s: RunSummary) -> PipeRoof | None:
    """None for a run without stages (or without the parts: recorded before they were measured)."""
    f = pipe(s)
    if f.stages < 2 or not (f.transfer_s or f.schedule_s):
        return None
    m = max(f.microbatches, 1)
    per_mb = f.p2p_bytes / m
    # each micro-batch: activations forward and gradients back, one message each per neighbour
    link = 2 * m * (f.p2p_alpha_s + f.p2p_beta_s_per_byte * per_mb / 2)
    parts = {
        "bubble": f.bubble_s,
        "transfers": f.transfer_s,
        "schedule overhead": f.schedule_s,
    }
    bound = max(parts, key=lambda k: parts[k])
    if s.compute_s >= sum(parts.values()):  # the three together cost less than the compute
        bound = "compute"
    return PipeRoof(
        m, per_mb, link, f.bubble_s, f.transfer_s, f.schedule_s, s.compute_s,
        theory(s), bound, _knob(s, bound, m),
    )  # fmt: skip


def _knob(s: RunSummary, bound: str, m: int) -> str:
    f = pipe(s)
    if bound == "bubble":
        share, expected = f.bubble_of_schedule, theory(s)
        if expected == 0:
            return (
                f"{f.schedule} idles only when the forward, input- and weight-gradient passes differ "
                "in time: balance the stages (parallelism.split_at), or check for a slow rank"
            )
        if share > 1.25 * expected:
            c = stage_compute(s)
            slow = f" (stage {c.index(max(c))} computes {max(c) / min(c):.2f}x the fastest's)" if c else ""
            return (
                f"the stages idle {share / expected:.1f}x what {f.schedule} predicts at m={m} with equal "
                f"stages{slow}: balance the stages (parallelism.split_at) or check for a slow rank"
            )
        return (
            f"more micro-batches (m={2 * m}: theory {100 * theory(s, 2 * m):.0f}% idle), "
            "or a schedule that idles less (interleaved_1f1b, interleaved_zb, zbv)"
        )
    if bound == "transfers":
        return "fewer stages (more layers per stage) or larger micro-batches: each moves its activations"
    if bound == "schedule overhead":
        per = 1e3 * f.schedule_s / m
        return f"fewer, larger micro-batches: each costs {per:.2f} ms of schedule overhead"
    return "idle time, transfers and schedule overhead together cost less than the compute"


def predict_step(s: RunSummary, m: int) -> float | None:
    """GPipe's and 1F1B's step time at m micro-batches from a run at another count, same batch
    and stages: each stage's compute per sample as measured (c_s m0 / m per micro-batch), the
    schedule's overhead per micro-batch as measured, each micro-batch's two messages per
    neighbour from the link (alpha + beta * bytes, the bytes shrinking with the micro-batch),
    the slowest stage pacing the steady state (theory_measured's T), and the rest of the step
    (update, data, loss) as measured. None for other schedules or records without the parts."""
    f = pipe(s)
    c = stage_compute(s)
    if not steady(f.schedule) or not c or m < 1:
        return None
    m0 = max(f.microbatches, 1)
    per_mb_bytes = f.p2p_bytes / m0 * m0 / m  # per micro-batch at m: the same samples, cut finer
    link = 2 * (f.p2p_alpha_s + f.p2p_beta_s_per_byte * per_mb_bytes / 2)
    over = f.schedule_s / m0
    slot = [x * m0 / m + link + over for x in c]  # one micro-batch through each stage
    sched = sum(slot) + (m - 1) * max(slot)
    rest = s.step_s - f.pipe_s  # update, data, loss: what does not depend on m
    return sched + rest


def best_microbatches(s: RunSummary, candidates: list[int]) -> tuple[int, float] | None:
    """The count with the shortest predicted step among the candidates, and that step time."""
    found = [(t, m) for m in candidates if (t := predict_step(s, m)) is not None]
    return None if not found else (min(found)[1], min(found)[0])


def study_lines(runs: Sequence[RunSummary]) -> list[str]:
    """For each scale of a study that ran GPipe or 1F1B at several micro-batch counts: the step
    model, fitted on the count in the middle, predicts the others (its error at each) and the best
    count among the measured ones and the powers of two that divide the batch."""
    groups: dict[tuple[int, str, str], dict[int, RunSummary]] = {}
    for r in runs:
        f = pipe(r)
        if f.stages > 1 and steady(f.schedule):
            groups.setdefault((r.world_size, r.engine, f.schedule), {}).setdefault(f.microbatches, r)
    out = []
    for (n, engine, schedule), by_m in sorted(groups.items()):
        if len(by_m) < 2:
            continue
        counts = sorted(by_m)
        src = by_m[counts[(len(counts) - 1) // 2]]
        m_src = pipe(src).microbatches
        per_replica = src.global_batch * pipe(src).stages // src.world_size
        candidates = sorted(set(counts) | {2**k for k in range(8) if per_replica % 2**k == 0})
        best = best_microbatches(src, candidates)
        errors = [
            f"m={m} {100 * (t / by_m[m].step_s - 1):+.1f}%"
            for m in counts
            if m != m_src and (t := predict_step(src, m)) is not None
        ]
        if best is None:
            continue
        fastest = min(counts, key=lambda m: by_m[m].step_s)
        out.append(
            f"N={n} {engine} {schedule}: from m={m_src} the model predicts m={best[0]} "
            f"fastest ({1e3 * best[1]:.2f} ms); measured fastest m={fastest} "
            f"({1e3 * by_m[fastest].step_s:.2f} ms); its error at " + ", ".join(errors)
        )
    return out


def report_rows(s: RunSummary) -> list[tuple[str, str, str, str]]:
    """The summary table's pipeline rows (analysis/part_rows.py): beside compute, idle (the
    bubble, with the schedule's theory), transfers (with the bytes and what the link predicts for
    them), the schedule's overhead; under peak memory, the peak of each stage."""
    f = pipe(s)
    per_stage = s.peak_by_stage
    memory = ("memory", "  per stage", " / ".join(f"{b / 2**20:.0f}" for b in per_stage) + " MiB", "")
    bubble = (
        "step",
        f"  pipeline bubble: idle ({f.schedule}, m={f.microbatches})",
        f"{1e3 * f.bubble_s:.2f} ms",
        f"{100 * f.bubble_share:.1f}% ({100 * f.bubble_of_schedule:.1f}% of the schedule; "
        f"theory {100 * theory(s):.1f}%)",
    )
    roof = for_pipeline(s)
    if roof is None:
        return [bubble, memory]
    advice = ("advice", f"pipeline {roof.bound}-bound: {roof.knob}", "", "")
    return [
        bubble,
        (
            "step",
            f"  pipeline transfers ({roof.bytes_per_microbatch / 2**10:.0f} KiB per micro-batch)",
            f"{1e3 * f.transfer_s:.2f} ms",
            f"{100 * f.transfer_share:.1f}% (link: {1e3 * roof.link_s:.2f} ms)",
        ),
        (
            "step",
            "  pipeline schedule overhead",
            f"{1e3 * f.schedule_s:.2f} ms",
            f"{100 * f.schedule_share:.1f}% ({1e3 * roof.overhead_per_microbatch_s:.2f} ms per micro-batch)",
        ),
        memory,
        advice,
    ]


# --- a study's report (analysis/study_parts.py) ---------------------------------------------------
def point_figures(runs: Sequence[RunSummary], step_s: float) -> dict[str, float]:
    """A point's pipeline figures, means over its repetitions: the bubble, and with stages its
    share of the step, the transfers, the schedule's overhead and the schedule's theory."""
    pipes = [part(r, PipelineFigures) for r in runs]

    def avg(k: str) -> float:
        return fmean(getattr(f, k) for f in pipes)

    out = {"bubble_s": avg("bubble_s")}
    first = pipes[0]
    if first.stages > 1:
        out.update(
            bubble_share=share(out["bubble_s"], step_s),
            transfer_s=avg("transfer_s"),
            schedule_s=avg("schedule_s"),
            bubble_theory=pipeline_bubble(
                first.stages, first.microbatches, first.schedule, first.pieces_per_rank
            ),
        )
    return out


def _pct(x: float) -> str:
    return "-" if math.isnan(x) else f"{100 * x:.1f}%"


def point_cells(f: Mapping[str, float], step_s: float) -> list[str]:
    nan = math.nan
    transfer, schedule = f.get("transfer_s", 0.0), f.get("schedule_s", 0.0)
    return [
        _pct(f.get("bubble_share", nan)),
        _pct(f.get("bubble_theory", nan)),
        _pct(transfer / step_s if transfer else nan),
        _pct(schedule / step_s if schedule else nan),
    ]


STUDY = StudyPart(
    figures=point_figures,
    columns=("bubble", "bubble theory", "transfer", "sched"),
    cells=point_cells,
    bars=(
        ("pipeline bubble (idle)", "bubble_s"),
        ("pipeline transfers", "transfer_s"),
        ("pipeline schedule overhead", "schedule_s"),
    ),
    idle="bubble_s",
    section="Pipeline micro-batches (the step model's pipeline terms)",
    label="pipeline micro-batches",
    lines=study_lines,
    # a sharded layout's stages name its series (a plain pipeline's grow with the scale: one series)
    layout=lambda r: f" pp={pipe(r).stages}" if pipe(r).stages > 1 and shard_degree(r) > 0 else "",
    variant=lambda r: f"m={pipe(r).microbatches}",
)
