"""What a dimension of the layout adds to the records: a record of its own, nested under "parts"
by its key, at each of three levels, so that RunSummary, RankSummary and StepRecord hold only what
every run has.

- step (StepRecord.parts): what one rank measured in one step, e.g. the pipeline's idle time;
- rank (RankSummary.parts): one rank's figures, the means of its timed steps' step part (fields
  of the same name) plus what its trainer measured once (`Trainer.figures()`: the link, the stage);
- run (RunSummary.parts): what the parallelism declared at plan time with the ranks' figures
  (`measured`).

A part is declared once per level, as a frozen dataclass with a KEY, a LEVEL ("run" when absent)
and, for the records written before parts existed, the flat keys it replaces (FLAT); a run part
of a dimension of the mesh names it for a run's title (`mesh_dim`: PipelineFigures, TensorFigures);
`register_part` makes the readers check it. A parallelism from another package declares and
registers its own the same way (tests/parallelisms/counted.py); a part nobody registered is kept
as read, a mapping.

Reading: `part(summary, PipelineFigures)`, the part or its defaults when the run had none."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from statistics import fmean
from typing import Any, ClassVar, Protocol, TypeVar

from hpctrain.errors import RecordError


def share(part_s: float, step_s: float) -> float:
    """A part's share of the step (the one definition the summary and the analysis use)."""
    return part_s / step_s if step_s > 0 else float("nan")


LEVELS = ("run", "rank", "step")


class Part(Protocol):
    KEY: ClassVar[str]
    # records written before parts existed: flat key -> this part's field
    FLAT: ClassVar[Mapping[str, str]]

    @classmethod
    def measured(cls, declared: Mapping[str, Any], per_rank: Sequence[Any], step_s: float) -> Any:
        """The part of a new summary: what the parallelism declared, with the ranks' figures."""
        ...


P = TypeVar("P")
T = TypeVar("T")


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


# --- tensor parallelism --------------------------------------------------------------------------
@dataclass(frozen=True)
class TensorRank:
    """A tensor-parallel rank: its collectives per step and their bytes, as all-reduce bytes
    (counted on the first warm-up step, train/tp_comm.py), and their seconds per step sent again
    alone after training (all exposed, though the step's clock counts them as compute)."""

    KEY: ClassVar[str] = "tensor"
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


# --- sharding, memory ----------------------------------------------------------------------------
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


# --- the registry, by level then key -------------------------------------------------------------
TYPES: dict[str, dict[str, type[Any]]] = {level: {} for level in LEVELS}
PART_TYPES: dict[str, type[Part]] = TYPES["run"]  # a run's parts (what summary.json holds)


def register_part(cls: type[T]) -> type[T]:
    """Make the readers of the part's level (its LEVEL, "run" when absent) check it (a class
    decorator)."""
    TYPES[getattr(cls, "LEVEL", "run")][getattr(cls, "KEY")] = cls  # noqa: B009
    return cls


for _cls in (
    PipelineStep,
    PipelineRank,
    PipelineFigures,
    TensorRank,
    TensorFigures,
    ShardFigures,
    MemoryFigures,
):
    register_part(_cls)


class Parts(dict[str, Any]):
    """RunSummary.parts: each registered part read as its record, any other kept as a mapping."""

    LEVEL: ClassVar[str] = "run"

    @classmethod
    def check_record(cls, value: Any, where: str) -> Parts:
        from hpctrain.records.typed import from_dict

        if type(value) is not dict:
            raise RecordError(f"{where}: expected a mapping, found {type(value).__name__}")
        out = cls()
        types = TYPES[cls.LEVEL]
        for key, v in value.items():
            part_cls = types.get(key)
            if part_cls is not None:
                out[key] = from_dict(part_cls, v, f"{where}.{key}")
            elif type(v) is dict:
                out[key] = v
            else:
                raise RecordError(f"{where}.{key}: expected a mapping, found {type(v).__name__}")
        return out


class RankParts(Parts):
    """RankSummary.parts."""

    LEVEL: ClassVar[str] = "rank"


class StepParts(Parts):
    """StepRecord.parts."""

    LEVEL: ClassVar[str] = "step"


def part(record: Any, cls: type[P]) -> P:
    """`record`'s part of type `cls` (its defaults when the record has none)."""
    from hpctrain.records.typed import from_dict

    key: str = getattr(cls, "KEY")  # noqa: B009
    value = record.parts.get(key)
    if isinstance(value, cls):
        return value
    if value is None:
        return cls()
    return from_dict(cls, value, f"parts.{key}")  # read before its type was registered


def rank_parts(timed: Sequence[Any], figures: Mapping[str, Mapping[str, Any]]) -> RankParts:
    """A rank's parts: for each part its timed steps hold or its trainer measured (`figures`, by
    key), the means over `timed` of the step part's fields of the same name (NaN without timed
    steps), with the figures."""
    keys = list(dict.fromkeys([k for r in timed[:1] for k in r.parts] + list(figures)))
    out = RankParts()
    for key in keys:
        cls = TYPES["rank"].get(key)
        if cls is None:
            raise KeyError(f"rank part {key!r} is not registered (records.parts.register_part)")
        step_cls = TYPES["step"].get(key)
        names = {f.name for f in fields(cls)} & {f.name for f in fields(step_cls)} if step_cls else set()
        steps = [part(r, step_cls) for r in timed] if step_cls else []
        means = {n: fmean(getattr(s, n) for s in steps) if steps else float("nan") for n in names}
        out[key] = cls(**{**means, **figures.get(key, {})})
    return out


def measured_parts(
    declared: Mapping[str, Mapping[str, Any]], per_rank: Sequence[Any], step_s: float
) -> Parts:
    """A new summary's parts: each declared part with what the ranks measured for it."""
    out = Parts()
    for key, values in declared.items():
        cls = PART_TYPES.get(key)
        if cls is None:
            raise KeyError(f"summary part {key!r} is not registered (records.parts.register_part)")
        out[key] = cls.measured(values, per_rank, step_s)
    return out


def nest_flat(level: str) -> Any:
    """The migration of a record of `level` written before parts existed: its flat keys moved into
    parts; a part left at its defaults (the figures of a dimension the run did not have) is dropped."""

    def migrate(data: dict[str, Any]) -> dict[str, Any]:
        types = TYPES[level]
        if "parts" in data or not any(k in data for cls in types.values() for k in cls.FLAT):
            return data
        data = dict(data)
        parts: dict[str, Any] = {}
        for key, cls in types.items():
            values = {field: data.pop(flat) for flat, field in cls.FLAT.items() if flat in data}
            if values and from_dict_quiet(cls, values) != cls():
                parts[key] = values
        data["parts"] = parts
        return data

    return migrate


def from_dict_quiet(cls: type[Any], values: dict[str, Any]) -> Any:
    """The part, or None when its old fields do not read (the reader then says what is wrong)."""
    from hpctrain.records.typed import from_dict

    try:
        return from_dict(cls, values)
    except RecordError:
        return None
