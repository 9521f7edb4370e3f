"""A parallelism for tests only, to show the axis is open: one rank holds the whole model. One
module, one registration line (tests/unit/test_parallelisms.py); its rule, notes and summary
fields are its own, and the built-in trainer runs it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hpctrain.errors import Problem
from hpctrain.parallel.base import ParallelismKind
from hpctrain.records import Layout

if TYPE_CHECKING:
    from hpctrain.config.schema import Config
    from hpctrain.facts import HostFacts
    from hpctrain.train.checkpoint import Restored
    from hpctrain.train.setup import Setup
    from hpctrain.train.step import Trainer


class Solo(ParallelismKind):
    @classmethod
    def layout(cls, cfg: Config, world: int, ranks_per_node: int) -> Layout:
        return Layout()

    @classmethod
    def problems(cls, cfg: Config, world: int, facts: HostFacts | None) -> list[Problem]:
        if world == 1:
            return []
        return [
            Problem(
                "cluster.ranks",
                f"{cls.name} holds the model on one rank (got {world})",
                "set cluster.ranks=1",
            )
        ]

    @classmethod
    def notes(cls, cfg: Config, layout: Layout, ranks_per_node: int) -> list[str]:
        return [f"{cls.name}: rank 0 holds the whole model"]

    @classmethod
    def about(cls, cfg: Config, layout: Layout, grads: dict[str, object]) -> dict[str, object]:
        return {**grads, "grad_grouping": "none"}

    @classmethod
    def build(cls, setup: Setup) -> tuple[Trainer, Restored]:
        from hpctrain.train.setup import data_parallel_trainer

        return data_parallel_trainer(setup)
