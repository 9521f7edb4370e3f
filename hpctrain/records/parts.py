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
of a dimension of the mesh names it for a run's title (`mesh_dim`: the pipeline's and tensor parallelism's);
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
    """A part of the records: a frozen dataclass with its KEY under "parts", its LEVEL (run, rank or
    step) and the flat keys of older records it replaces (FLAT); registered with register_part."""

    KEY: ClassVar[str]
    # records written before parts existed: flat key -> this part's field
    FLAT: ClassVar[Mapping[str, str]]

    @classmethod
    def measured(cls, declared: Mapping[str, Any], per_rank: Sequence[Any], step_s: float) -> Any:
        """The part of a new summary: what the parallelism declared, with the ranks' figures."""
        ...


P = TypeVar("P")
T = TypeVar("T")


# --- memory ----------------------------------------------------------------------------
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
_PACKAGES_READ: list[bool] = []


def types(level: str) -> dict[str, type[Any]]:
    """The registered parts of `level`, the dimensions' packages' included (imported on first use:
    <package>.figures:PARTS, hpctrain/dimension_packages.py), first in each level's order, by key."""
    if not _PACKAGES_READ:
        from hpctrain.dimension_packages import by_part
        from hpctrain.registry import load

        _PACKAGES_READ.append(True)
        packaged = [cls for target in by_part("figures", "PARTS").values() for cls in load(target)]
        for lvl in LEVELS:
            mine = {c.KEY: c for c in packaged if getattr(c, "LEVEL", "run") == lvl}
            rest = [(k, c) for k, c in TYPES[lvl].items() if k not in mine]
            TYPES[lvl].clear()
            TYPES[lvl].update([*mine.items(), *rest])
    return TYPES[level]


def register_part(cls: type[T]) -> type[T]:
    """Make the readers of the part's level (its LEVEL, "run" when absent) check it (a class
    decorator)."""
    TYPES[getattr(cls, "LEVEL", "run")][getattr(cls, "KEY")] = cls  # noqa: B009
    return cls


register_part(MemoryFigures)


class Parts(dict[str, Any]):
    """RunSummary.parts: each registered part read as its record, any other kept as a mapping."""

    LEVEL: ClassVar[str] = "run"

    @classmethod
    def check_record(cls, value: Any, where: str) -> Parts:
        from hpctrain.records.typed import from_dict

        if type(value) is not dict:
            raise RecordError(f"{where}: expected a mapping, found {type(value).__name__}")
        out = cls()
        known = types(cls.LEVEL)
        for key, v in value.items():
            part_cls = known.get(key)
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


def split_degree(record: Any) -> int:
    """Ranks each layer of a run is split over (1: none): the degree of each run part whose
    dimension splits layers (SPLITS_LAYERS: tensor parallelism's), multiplied."""
    n = 1
    for cls in types("run").values():
        if getattr(cls, "SPLITS_LAYERS", False):
            n *= max(int(getattr(part(record, cls), "degree", 1)), 1)
    return n


def shard_degree(record: Any) -> int:
    """Ranks one shard group of a run spans (0: its data-parallel ranks hold the whole model): the
    degree of its run part that shards them (SHARDS_REPLICAS: fsdp/hsdp's)."""
    for cls in types("run").values():
        if getattr(cls, "SHARDS_REPLICAS", False) and cls.KEY in record.parts:
            return int(getattr(part(record, cls), "degree", 0))
    return 0


def stage_of(rank: Any) -> int:
    """The piece of the model a rank holds, as a part of its record names it (`stage`: a
    pipeline's); 0 where the rank holds the whole model. `rank`: a RankSummary, or its mapping as
    written (the parts under "parts", or flat in records written before parts existed)."""
    written = isinstance(rank, Mapping)
    for value in (rank.get("parts", {}) if written else rank.parts).values():
        stage = value.get("stage") if isinstance(value, Mapping) else getattr(value, "stage", None)
        if stage is not None:
            return int(stage)
    return int(rank.get("stage", 0)) if written else 0


def rank_parts(timed: Sequence[Any], figures: Mapping[str, Mapping[str, Any]]) -> RankParts:
    """A rank's parts: for each part its timed steps hold or its trainer measured (`figures`, by
    key), the means over `timed` of the step part's fields of the same name (NaN without timed
    steps), with the figures."""
    keys = list(dict.fromkeys([k for r in timed[:1] for k in r.parts] + list(figures)))
    out = RankParts()
    for key in keys:
        cls = types("rank").get(key)
        if cls is None:
            raise KeyError(f"rank part {key!r} is not registered (records.parts.register_part)")
        step_cls = types("step").get(key)
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
        cls = types("run").get(key)
        if cls is None:
            raise KeyError(f"summary part {key!r} is not registered (records.parts.register_part)")
        out[key] = cls.measured(values, per_rank, step_s)
    return out


def nest_flat(level: str) -> Any:
    """The migration of a record of `level` written before parts existed: its flat keys moved into
    parts; a part left at its defaults (the figures of a dimension the run did not have) is dropped."""

    def migrate(data: dict[str, Any]) -> dict[str, Any]:
        known = types(level)
        if "parts" in data or not any(k in data for cls in known.values() for k in cls.FLAT):
            return data
        data = dict(data)
        parts: dict[str, Any] = {}
        for key, cls in known.items():
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
