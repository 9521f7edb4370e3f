"""Tensor parallelism in a run's summary (analysis/part_rows.py) and a study's report
(analysis/study_parts.py): its collectives placed on the run's own allreduce curve (the roofline's
alpha-beta model, analysis/model.py), all exposed, beside their time replayed alone."""

from __future__ import annotations

import math
from dataclasses import dataclass

from hpctrain.analysis.model import from_probe
from hpctrain.analysis.roofline import MIB
from hpctrain.analysis.study_parts import StudyPart
from hpctrain.parallel.tensor.figures import TensorFigures
from hpctrain.records import RunSummary
from hpctrain.records.parts import part


@dataclass(frozen=True)
class TpRoofline:
    """Tensor parallelism's collectives on the same curve: they run inside the forward and
    backward passes, between the layers that need their results, so nothing hides them: all of
    their time is exposed, though the step's clock counts it as compute. The run replays them
    alone after training (comm.py) for their measured time beside the expected."""

    tp: int
    messages: int
    allreduce_bytes: float  # the all-reduce bytes that put as much on the wire (comm.py)
    latency_s: float
    bandwidth_s: float
    compute_s: float  # the step's measured compute, which holds them
    measured_s: float = 0.0  # one step's collectives replayed alone (0: not measured)

    @property
    def expected_s(self) -> float:
        return self.latency_s + self.bandwidth_s

    @property
    def exposed_s(self) -> float:
        """Their time in a step: measured where replayed, else expected."""
        return self.measured_s if self.measured_s > 0 else self.expected_s

    @property
    def share(self) -> float:
        """Of the step's compute, which holds them (NaN without a measured compute time)."""
        return self.exposed_s / self.compute_s if self.compute_s > 0 else math.nan

    @property
    def bound(self) -> str:
        return "latency" if self.latency_s > self.bandwidth_s else "bandwidth"

    @property
    def knob(self) -> str:
        if self.bound == "latency":
            return (
                "more work per collective: a larger batch per rank, or a smaller parallelism.tp.degree "
                "(fewer ranks per layer, more data-parallel replicas or shards)"
            )
        return (
            "keep each tensor-parallel group inside a node (consecutive ranks: the default) on the "
            "fastest links, or trade tp.degree for sharding (parallelism=fsdp)"
        )

    def line(self) -> str:
        measured = (
            f", measured {1e3 * self.measured_s:.2f} ms replayed alone ({self.measured_s / self.expected_s:.2f}x)"
            if self.measured_s > 0 and self.expected_s > 0
            else ""
        )
        return (
            f"tensor parallel: {self.messages} collective(s) per step over {self.tp} ranks, "
            f"{self.allreduce_bytes / MIB:.2f} MiB as all-reduce bytes: expected {1e3 * self.expected_s:.2f} ms "
            f"(latency {1e3 * self.latency_s:.2f} + bandwidth {1e3 * self.bandwidth_s:.2f}){measured}, "
            f"all exposed: {100 * self.share:.0f}% of the step's compute, which holds them; "
            f"{self.bound}-bound: {self.knob}"
        )


def for_tensor_parallel(s: RunSummary) -> TpRoofline | None:
    """The TP collectives of a run on its own probe (None: no tensor parallelism, not counted, or
    no probe). The probe times an all-reduce over the whole world; its per-step latency and
    per-byte cost stand in for the TP group's (the same links within a node)."""
    t = part(s, TensorFigures)
    if t.degree <= 1 or t.messages <= 0:
        return None
    comm = from_probe(s.world_size, s.grad_bytes, s.probe_small_s, s.probe_full_s)
    if comm is None:
        return None
    return TpRoofline(
        t.degree,
        t.messages,
        t.bytes,
        comm.latency_part(t.degree, t.messages),
        comm.bandwidth_part(t.degree, t.bytes),
        s.compute_s,
        t.comm_s,
    )


def report_rows(s: RunSummary) -> list[tuple[str, str, str, str]]:
    """The summary table's row under compute, which holds them (analysis/part_rows.py): TP's
    collectives, replayed alone (and expected)."""
    tp = for_tensor_parallel(s)
    if tp is None:
        return []
    value = f"expected {1e3 * tp.expected_s:.2f} ms"
    if tp.measured_s > 0:
        value = f"{1e3 * tp.measured_s:.2f} ms ({value})"
    share = f"{100 * tp.exposed_s / s.step_s:.1f}% " if math.isfinite(s.step_s) and s.step_s > 0 else ""
    return [
        (
            "compute",
            "    of which TP collectives (exposed)",
            value,
            share + f"({tp.messages} collectives, {tp.allreduce_bytes / 2**20:.2f} MiB)",
        ),
        ("advice", tp.line(), "", ""),
    ]


def _tp_layout(r: RunSummary) -> str:
    degree = part(r, TensorFigures).degree
    return f" tp={degree}" if degree > 1 else ""


STUDY = StudyPart(layout=_tp_layout)  # a study's view of the part (analysis/study_parts.py)
