"""A parallelism of another package: one rank holds the whole model. hpctrain finds it by its
entry point (pyproject.toml: the group `hpctrain.parallelisms`), and asks it, as it asks its own
(hpctrain.parallel.base.ParallelismKind; the documentation's Python API reference), for its layout,
its rules, its notes, its summary and its trainer. No line of hpctrain changes."""

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
        """Nothing split: the layout of one rank."""
        return Layout()

    @classmethod
    def problems(cls, cfg: Config, world: int, facts: HostFacts | None) -> list[Problem]:
        """Its one rule, checked before anything starts: one rank."""
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
        """What --dry-run and the run's start say of it."""
        return [f"{cls.name}: rank 0 holds the whole model"]

    @classmethod
    def build(cls, setup: Setup) -> tuple[Trainer, Restored]:
        """Its trainer on the rank: hpctrain's data-parallel one, over a world of one."""
        from hpctrain.train.setup import data_parallel_trainer

        return data_parallel_trainer(setup)
