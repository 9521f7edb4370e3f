"""A parallelism for tests only, to show that one with its own setting, measurements and report
rows is one module plus one registration line (tests/unit/test_parallelisms.py), as
docs/contributing.md describes: one rank holds the whole model, as with solo, and the step counts
one step in `every`.

- its setting: parallelism.options.every (CountedOptions), checked and refused by its own rule;
- its measurements, at each level of the records (hpctrain/records/parts.py): each step's part
  (CountedStep: was this step counted), each rank's (CountedRank: the share of its timed steps
  counted, and `every` as its trainer's figures() says), the run's (CountedFigures: the steps
  counted over all ranks);
- its report rows: the summary table's line for its part (register_rows), and its column in a
  study's points table (register_study_part)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import fmean
from typing import TYPE_CHECKING, Any, ClassVar

from hpctrain.analysis.part_rows import register_rows
from hpctrain.analysis.study_parts import StudyPart, register_study_part
from hpctrain.errors import Problem
from hpctrain.parallel.base import ParallelismKind
from hpctrain.records import Layout, RunSummary
from hpctrain.records.parts import part, register_part
from hpctrain.train.step import DataParallelTrainer, StepInput, StepResult

if TYPE_CHECKING:
    from hpctrain.config.schema import Config
    from hpctrain.facts import HostFacts
    from hpctrain.train.checkpoint import Restored
    from hpctrain.train.setup import Setup
    from hpctrain.train.step import Trainer


@dataclass
class CountedOptions:
    every: int = 1  # count one in this many steps


@register_part
@dataclass(frozen=True)
class CountedStep:
    KEY: ClassVar[str] = "counted"
    LEVEL: ClassVar[str] = "step"
    FLAT: ClassVar[Mapping[str, str]] = {}

    counted: int = 0  # 1: this step is one in `every`


@register_part
@dataclass(frozen=True)
class CountedRank:
    KEY: ClassVar[str] = "counted"
    LEVEL: ClassVar[str] = "rank"
    FLAT: ClassVar[Mapping[str, str]] = {}

    every: int = 1  # the trainer's figures()
    counted: float = 0.0  # the mean of the timed steps' CountedStep.counted: the share counted


@register_part
@dataclass(frozen=True)
class CountedFigures:
    KEY: ClassVar[str] = "counted"
    FLAT: ClassVar[Mapping[str, str]] = {}

    every: int = 1
    counted: int = 0  # timed steps over all ranks, one in `every`

    @classmethod
    def measured(cls, declared: Mapping[str, Any], per_rank: Sequence[Any], step_s: float) -> CountedFigures:
        shares = [(part(r, CountedRank).counted, r.timed_steps) for r in per_rank]
        return cls(every=int(declared["every"]), counted=round(sum(c * n for c, n in shares)))


@register_rows("counted")
def counted_rows(s: RunSummary) -> list[tuple[str, str, str, str]]:
    f = part(s, CountedFigures)
    return [("step", f"  counted steps (one in {f.every})", str(f.counted), "")]


def _point(runs: Sequence[RunSummary], step_s: float) -> dict[str, float]:
    return {"counted": fmean(part(r, CountedFigures).counted for r in runs)}


register_study_part(
    "counted",
    StudyPart(
        figures=_point,
        columns=("counted",),
        cells=lambda f, step_s: ["-" if math.isnan(f.get("counted", math.nan)) else f"{f['counted']:.1f}"],
    ),
)


@dataclass(kw_only=True)
class CountedTrainer(DataParallelTrainer):
    """The data-parallel step, each step's part added to its result."""

    every: int = 1

    def train_step(self, b: StepInput) -> StepResult:
        r = super().train_step(b)
        return dataclasses.replace(
            r, parts={**r.parts, "counted": CountedStep(int(b.step % self.every == 0))}
        )

    def figures(self) -> dict[str, dict[str, Any]]:
        return {**super().figures(), "counted": {"every": self.every}}


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

        t, restored = data_parallel_trainer(setup, CountedTrainer)
        if isinstance(t, CountedTrainer):
            t.every = cls.read_options(setup.cfg).every
        return t, restored
