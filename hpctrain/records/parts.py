"""What a dimension of the layout adds to a run's summary: a record of its own, nested under
summary.json's "parts" by its key, so that RunSummary holds only what every run has.

A part is declared once, as a frozen dataclass with a KEY, a `measured` constructor and (for the
records written before parts existed) the flat summary keys it replaces; `register_part` makes the
readers check it. The built-in parts: the pipeline's stages and schedule with their idle, transfer
and overhead figures, tensor parallelism's degree and collectives, and the shard degree. A
parallelism from another package declares and registers its own the same way
(tests/parallelisms/counted.py); a part nobody registered is kept as read, a mapping.

Reading: `part(summary, PipelineFigures)`, the part or its defaults when the run had none."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import fmean
from typing import Any, ClassVar, Protocol, TypeVar

from hpctrain.errors import RecordError


def share(part_s: float, step_s: float) -> float:
    """A part's share of the step (the one definition the summary and the analysis use)."""
    return part_s / step_s if step_s > 0 else float("nan")


class Part(Protocol):
    KEY: ClassVar[str]
    # records written before parts existed: flat summary key -> this part's field
    FLAT: ClassVar[Mapping[str, str]]

    @classmethod
    def measured(cls, declared: Mapping[str, Any], per_rank: Sequence[Any], step_s: float) -> Any:
        """The part of a new summary: what the parallelism declared, with the ranks' figures."""
        ...


P = TypeVar("P")
PartT = TypeVar("PartT", bound=Part)


@dataclass(frozen=True)
class PipelineFigures:
    """Pipeline stages: the schedule, and per step the means over ranks of idle waiting for a
    neighbour (the bubble), moving activations and gradients, the schedule's own overhead, the
    bytes a rank sends and receives, and the link between neighbouring stages (alpha + beta * bytes)."""

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
        def avg(k: str) -> float:
            return fmean(getattr(r, k) for r in per_rank)

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

    @property
    def bubble_of_schedule(self) -> float:
        """Idle share of the schedule's wall time, what a schedule's theory predicts (the step's
        share without the update, data and loss; older records: the step's share)."""
        return self.bubble_s / self.pipe_s if self.pipe_s > 0 else self.bubble_share


@dataclass(frozen=True)
class TensorFigures:
    """Tensor parallelism: ranks per group, its collectives per step (rank 0's: every rank of a
    group sends the same) as all-reduce bytes, and their seconds replayed alone (mean over ranks)."""

    KEY: ClassVar[str] = "tensor"
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

    @classmethod
    def measured(cls, declared: Mapping[str, Any], per_rank: Sequence[Any], step_s: float) -> TensorFigures:
        return cls(
            **declared,
            messages=per_rank[0].tp_messages,
            bytes=per_rank[0].tp_bytes,
            comm_s=fmean(r.tp_comm_s for r in per_rank),
        )


@dataclass(frozen=True)
class ShardFigures:
    """Sharded data parallelism (fsdp/hsdp): ranks one shard group spans."""

    KEY: ClassVar[str] = "shards"
    FLAT: ClassVar[Mapping[str, str]] = {"shard_degree": "degree"}

    degree: int = 0

    @classmethod
    def measured(cls, declared: Mapping[str, Any], per_rank: Sequence[Any], step_s: float) -> ShardFigures:
        return cls(**declared)


@dataclass(frozen=True)
class MemoryFigures:
    """A run that passed a memory check before it started (plan.json's memory): the prediction it
    passed with, the limit, and what its worst rank then reached."""

    KEY: ClassVar[str] = "memory"
    FLAT: ClassVar[Mapping[str, str]] = {}

    predicted_bytes: int = 0
    needed_bytes: int = 0  # with the prediction's error band: what the check held against the limit
    limit_bytes: int = 0
    limit_key: str = ""
    measured_bytes: int = 0  # the worst rank's peak
    measured_over_predicted: float = 0.0
    over_limit: bool = False

    @classmethod
    def measured(cls, declared: Mapping[str, Any], per_rank: Sequence[Any], step_s: float) -> MemoryFigures:
        peak = max(r.peak_memory_bytes for r in per_rank)
        predicted = int(declared["predicted_bytes"])
        return cls(
            **declared,
            measured_bytes=peak,
            measured_over_predicted=peak / predicted if predicted > 0 else 0.0,
            over_limit=peak > int(declared["limit_bytes"]),
        )


# what a part's class has (PipelineFigures is one): a KEY, FLAT and `measured`
PART_TYPES: dict[str, type[Part]] = {
    c.KEY: c for c in (PipelineFigures, TensorFigures, ShardFigures, MemoryFigures)
}


def register_part(cls: type[PartT]) -> type[PartT]:
    """Make the summary's readers check this part (a class decorator)."""
    PART_TYPES[cls.KEY] = cls
    return cls


class Parts(dict[str, Any]):
    """RunSummary.parts: each registered part read as its record, any other kept as a mapping."""

    @staticmethod
    def check_record(value: Any, where: str) -> Parts:
        from hpctrain.records.typed import from_dict

        if type(value) is not dict:
            raise RecordError(f"{where}: expected a mapping, found {type(value).__name__}")
        out = Parts()
        for key, v in value.items():
            cls = PART_TYPES.get(key)
            if cls is not None:
                out[key] = from_dict(cls, v, f"{where}.{key}")
            elif type(v) is dict:
                out[key] = v
            else:
                raise RecordError(f"{where}.{key}: expected a mapping, found {type(v).__name__}")
        return out


def part(record: Any, cls: type[P]) -> P:
    """`record`'s part of type `cls` (its defaults when the run had none)."""
    from hpctrain.records.typed import from_dict

    key: str = getattr(cls, "KEY")  # noqa: B009
    value = record.parts.get(key)
    if isinstance(value, cls):
        return value
    if value is None:
        return cls()
    return from_dict(cls, value, f"parts.{key}")  # read before its type was registered


def measured_parts(
    declared: Mapping[str, Mapping[str, Any]], per_rank: Sequence[Any], step_s: float
) -> Parts:
    """A new summary's parts: each declared part with what the ranks measured for it."""
    out = Parts()
    for key, fields in declared.items():
        cls = PART_TYPES.get(key)
        if cls is None:
            raise KeyError(f"summary part {key!r} is not registered (records.parts.register_part)")
        out[key] = cls.measured(fields, per_rank, step_s)
    return out


def nest_flat(data: dict[str, Any]) -> dict[str, Any]:
    """A summary written before parts existed, its flat keys moved into parts (the one migration);
    a part left at its defaults (the figures of a dimension the run did not have) is dropped."""
    if "parts" in data or not any(k in data for cls in PART_TYPES.values() for k in cls.FLAT):
        return data
    data = dict(data)
    parts: dict[str, Any] = {}
    for key, cls in PART_TYPES.items():
        fields = {field: data.pop(flat) for flat, field in cls.FLAT.items() if flat in data}
        if fields and from_dict_quiet(cls, fields) != cls():
            parts[key] = fields
    data["parts"] = parts
    return data


def from_dict_quiet(cls: type[Any], fields: dict[str, Any]) -> Any:
    """The part, or None when its old fields do not read (the reader then says what is wrong)."""
    from hpctrain.records.typed import from_dict

    try:
        return from_dict(cls, fields)
    except RecordError:
        return None
