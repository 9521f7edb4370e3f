"""A parallelism for tests only, to show that one with its own setting, measurement and report row
is one module plus one registration line (tests/unit/test_parallelisms.py): one rank holds the
whole model, as with solo, and the summary counts the steps the ranks timed, every `every` of them.

- its setting: parallelism.options.every (CountedOptions), checked and refused by its own rule;
- its measurement: the summary's part "counted" (CountedFigures), measured from the ranks' figures;
- its report row: the summary table's line for that part (register_rows)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from hpctrain.analysis.part_rows import register_rows
from hpctrain.errors import Problem
from hpctrain.parallel.base import ParallelismKind
from hpctrain.records import Layout, RunSummary
from hpctrain.records.parts import part, register_part

if TYPE_CHECKING:
    from hpctrain.config.schema import Config
    from hpctrain.facts import HostFacts
    from hpctrain.train.checkpoint import Restored
    from hpctrain.train.setup import Setup
    from hpctrain.train.step import Trainer


@dataclass
class CountedOptions:
    every: int = 1  # count one in this many timed steps


@register_part
@dataclass(frozen=True)
class CountedFigures:
    KEY: ClassVar[str] = "counted"
    FLAT: ClassVar[Mapping[str, str]] = {}

    every: int = 1
    counted: int = 0  # timed steps over all ranks, one in `every`

    @classmethod
    def measured(cls, declared: Mapping[str, Any], per_rank: Sequence[Any], step_s: float) -> CountedFigures:
        every = int(declared["every"])
        return cls(every=every, counted=sum(r.timed_steps for r in per_rank) // every)


@register_rows("counted")
def counted_rows(s: RunSummary) -> list[tuple[str, str, str, str]]:
    f = part(s, CountedFigures)
    return [("step", f"  counted steps (one in {f.every})", str(f.counted), "")]


class Counted(ParallelismKind):
    options = CountedOptions

    @classmethod
    def layout(cls, cfg: Config, world: int, ranks_per_node: int) -> Layout:
        return Layout()

    @classmethod
    def problems(cls, cfg: Config, world: int, facts: HostFacts | None) -> list[Problem]:
        if cls.read_options(cfg).every >= 1:
            return []
        return [Problem("parallelism.options.every", "must be >= 1", "e.g. +parallelism.options.every=2")]

    @classmethod
    def about(cls, cfg: Config, layout: Layout, grads: dict[str, object]) -> dict[str, object]:
        parts = {CountedFigures.KEY: {"every": cls.read_options(cfg).every}}
        return {**grads, "parts": parts, "grad_grouping": "none"}

    @classmethod
    def build(cls, setup: Setup) -> tuple[Trainer, Restored]:
        from hpctrain.train.setup import data_parallel_trainer

        return data_parallel_trainer(setup)
