"""A dimension's rank side (parallel/dimensions.py: Dimension.rank_side): what a rank does for a
dimension of the layout that the parallelism does not know of (context parallelism). It wraps the
whole model before the parallelism splits, shards or cuts it, and every step's forward and backward
run inside it, with its targets; its figures join the rank's summary (records/parts.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

from torch import nn


class RankDimension(Protocol):
    def wrap(self, module: nn.Module) -> None:
        """Hooks on the whole model (its modules keep them when split, sharded or cut)."""

    def within(self) -> contextlib.AbstractContextManager[None]:
        """What a step's forward and backward run inside (and the memory trace's)."""

    def targets(self, y: Any) -> Any:
        """The targets of this rank's share of the batch (the whole batch's as given)."""

    def figures(self) -> dict[str, dict[str, Any]]:
        """What it measured, by rank part key (collective: every rank asks, after training)."""


@contextlib.contextmanager
def within(dims: Sequence[RankDimension]) -> Iterator[None]:
    """Inside every dimension's `within`, the first outermost."""
    with contextlib.ExitStack() as stack:
        for d in dims:
            stack.enter_context(d.within())
        yield


def targets(dims: Sequence[RankDimension], y: Any) -> Any:
    for d in dims:
        y = d.targets(y)
    return y


def figures(dims: Sequence[RankDimension]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for d in dims:
        out.update(d.figures())
    return out
