"""A dimension's rank side (parallel/dimensions.py: Dimension.rank_side): what a rank does for a
dimension of the layout that the parallelism does not know of (context parallelism). It wraps the
whole model before the parallelism splits, shards or cuts it, and every step's forward and backward
run inside it, with its targets; what it measures joins the step's and the rank's records
(records/parts.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

import torch
from torch import nn


class RankDimension(Protocol):
    def wrap(self, module: nn.Module) -> None:
        """Hooks on the whole model (its modules keep them when split, sharded or cut)."""

    def check(self, module: nn.Module, objective: Any, sample: tuple[torch.Tensor, torch.Tensor]) -> None:
        """One sample (batch of 1, on the device) through the wrapped model against the model
        whole, before training: a model it cannot take is refused by name instead of training
        something else than one rank would (collective: every rank checks; nothing changes)."""

    def within(self) -> contextlib.AbstractContextManager[None]:
        """What a step's forward and backward run inside (and the memory trace's)."""

    def targets(self, y: Any) -> Any:
        """The targets of this rank's share of the batch (the whole batch's as given)."""

    def loss(self, loss: torch.Tensor) -> torch.Tensor:
        """The step's loss as the whole batch's, from this rank's (its share's mean)."""

    def step_part(self) -> dict[str, Any]:
        """What it measured in the step just ended, by step part key (records/parts.py)."""

    def figures(self) -> dict[str, dict[str, Any]]:
        """What it measured once, by rank part key (collective: every rank asks, after training)."""


class LayerSplit(Protocol):
    """What a rank does for a dimension that splits each layer over its ranks (tensor
    parallelism's, parallel/tensor/side.py): it splits the model the parallelism then shards or
    replicates (or each pipeline piece), counts the collectives of one warm-up step, and times them
    again alone after training. Asked by the trainers that build on a device mesh (train/mesh_trainer.py,
    the pipeline's mesh) and the memory trace; given by the dimension (Setup.layer_split)."""

    key: str  # the setting that split the model (a one-sample check's message names it)
    hint: str  # what a user's forward that fails once split most often lacks

    def split(self, module: nn.Module, mesh: Any, whole: bool) -> nn.Module:
        """`module` split in place over its dimension of `mesh` (a device mesh, or the memory
        trace's meshes by name): the whole model, or a pipeline's piece (the plan's part in it)."""

    def counting(self) -> contextlib.AbstractContextManager[None]:
        """What one warm-up step runs inside, forward and backward, to count the collectives."""

    def after_training(self, device: torch.device) -> None:
        """The counted collectives replayed alone and timed (collective: every rank)."""

    def figures(self) -> dict[str, dict[str, Any]]:
        """What it measured, by rank part key (nothing where it counted nothing)."""


_NOTHING = contextlib.nullcontext()  # reusable: a step without named dimensions builds nothing


def within(dims: Sequence[RankDimension]) -> contextlib.AbstractContextManager[Any]:
    """Inside every dimension's `within`, the first outermost."""
    return _within(dims) if dims else _NOTHING


@contextlib.contextmanager
def _within(dims: Sequence[RankDimension]) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        for d in dims:
            stack.enter_context(d.within())
        yield


def targets(dims: Sequence[RankDimension], y: Any) -> Any:
    """This rank's share of the targets (each dimension's in turn)."""
    for d in dims:
        y = d.targets(y)
    return y


def loss(dims: Sequence[RankDimension], value: torch.Tensor) -> torch.Tensor:
    for d in dims:
        value = d.loss(value)
    return value


def step_parts(dims: Sequence[RankDimension]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for d in dims:
        out.update(d.step_part())
    return out


def figures(dims: Sequence[RankDimension]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for d in dims:
        out.update(d.figures())
    return out
