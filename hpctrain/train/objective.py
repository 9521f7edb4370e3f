"""How a step's loss is made from the model, a batch's inputs and its targets (the `loss` group):

  cross_entropy  loss(model(inputs), targets): the trainer's cross-entropy over the model's last
                 dimension, or the user's loss function (loss._target_)
  model          the model computes its own: model(inputs, targets), or with loss.targets_as=labels
                 model(inputs, labels=targets) (Hugging Face's convention), and the loss is taken
                 from what it returns (loss_of)

Every layout asks the objective, never the loss mode: the data-parallel and sharded steps call it
on the whole model, a pipeline traces the model with the inputs it names (`inputs`) and has its
last stage take the loss from the last piece's output (`stage_loss`), the FLOP count, the memory
trace and the first-sample probe run what a step runs.
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from hpctrain.errors import HpctrainError


class LossOutputError(HpctrainError):
    """A model's output holds no loss that `loss=model` can take."""


class Objective(ABC):
    """A step's loss from the model and a (micro-)batch."""

    @abstractmethod
    def inputs(self, x: Any, y: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """What the model's forward is called with: (positional, keyword) arguments."""

    @abstractmethod
    def stage_loss(self, out: Any, y: Any) -> torch.Tensor:
        """The loss from the model's output (the last pipeline stage's) and the targets."""

    def __call__(self, model: nn.Module, x: Any, y: Any) -> torch.Tensor:
        args, kwargs = self.inputs(x, y)
        return self.stage_loss(model(*args, **kwargs), y)

    def targets_name(self, model: nn.Module) -> str | None:
        """The name the model's forward takes the targets by (a pipeline's last stage is given
        them under it), or None where the targets go to the loss function instead."""
        return None


class LossOnOutput(Objective):
    """loss(model(inputs), targets): cross-entropy, or the user's loss function."""

    def __init__(self, criterion: nn.Module) -> None:
        self.criterion = criterion

    def inputs(self, x: Any, y: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return (x,), {}

    def stage_loss(self, out: Any, y: Any) -> torch.Tensor:
        if not isinstance(out, torch.Tensor):
            raise LossOutputError(
                f"the loss function (loss=cross_entropy, or loss._target_) takes the model's output as one "
                f"tensor, but the model returned {describe(out)}; a model that computes its own loss "
                "trains with loss=model"
            )
        loss: torch.Tensor = self.criterion(out, y)
        return loss


class ModelLoss(Objective):
    """The model's own loss: forward(inputs, targets), or forward(inputs, <targets_as>=targets)."""

    def __init__(self, targets_as: str | None) -> None:
        self.targets_as = targets_as

    def inputs(self, x: Any, y: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return ((x,), {self.targets_as: y}) if self.targets_as else ((x, y), {})

    def stage_loss(self, out: Any, y: Any) -> torch.Tensor:
        return loss_of(out)

    def targets_name(self, model: nn.Module) -> str | None:
        if self.targets_as:
            return self.targets_as
        names = list(inspect.signature(model.forward).parameters)
        if len(names) < 2:
            raise LossOutputError(
                f"loss=model calls forward(inputs, targets), but {type(model).__name__}.forward takes "
                f"({', '.join(names)}): give it a targets argument, or set loss.targets_as to its keyword"
            )
        return names[1]


def loss_of(out: Any) -> torch.Tensor:
    """The loss a model returned: the tensor itself; `.loss` or `["loss"]` of an output object or
    mapping (Hugging Face's ModelOutput is both); or the one scalar tensor of a tuple or list
    (GPT-2's (logits, loss), Hugging Face's (loss, logits, ...) with return_dict=False)."""
    if isinstance(out, torch.Tensor):
        found: Any = out
    elif isinstance(out, Mapping) and "loss" in out:
        found = out["loss"]
    elif not isinstance(out, tuple | list) and isinstance(getattr(out, "loss", None), torch.Tensor):
        found = out.loss
    elif isinstance(out, tuple | list):
        scalars = [v for v in out if isinstance(v, torch.Tensor) and v.dim() == 0]
        found = scalars[0] if len(scalars) == 1 else None
    else:
        found = None
    if not isinstance(found, torch.Tensor) or found.numel() != 1 or not found.is_floating_point():
        raise LossOutputError(
            f"loss=model: the model returned {describe(out)}, which holds no loss; return the loss as "
            "a scalar tensor, a tuple holding exactly one (logits, loss), or an output with .loss"
        )
    return found.reshape(())


def logits_of(out: Any) -> torch.Tensor | None:
    """The logits in what a model returned without targets (held-out accuracy): the tensor
    itself, `.logits` / ["logits"], or the first tensor of a tuple that is not a scalar; None
    where there are none."""
    if isinstance(out, torch.Tensor):
        return out
    found = out.get("logits") if isinstance(out, Mapping) else getattr(out, "logits", None)
    if isinstance(found, torch.Tensor):
        return found
    if isinstance(out, tuple | list):
        return next((v for v in out if isinstance(v, torch.Tensor) and v.dim() > 0), None)
    return None


def describe(out: Any) -> str:
    """A model's output in a few words: its type and, for tensors, shapes and dtypes."""
    if isinstance(out, torch.Tensor):
        return f"a tensor {tuple(out.shape)} {str(out.dtype).removeprefix('torch.')}"
    if isinstance(out, tuple | list):
        inner = ", ".join(describe(v) for v in list(out)[:4])
        return f"a {type(out).__name__} of {len(out)} ({inner}{', ...' if len(out) > 4 else ''})"
    if isinstance(out, Mapping):
        return f"a {type(out).__name__} with keys {sorted(map(str, out))[:8]}"
    return f"a {type(out).__name__}" if out is not None else "None"
