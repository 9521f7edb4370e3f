"""What the built-in trainer trains: the model, the data and the loss, built in or the user's
own (model/data/loss _target_, built by train/targets.py)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from hpctrain.config.schema import Config
from hpctrain.train import targets
from hpctrain.train.data import build_dataset
from hpctrain.train.models import InputSpec, build_model
from hpctrain.train.objective import LossOnOutput, ModelLoss, Objective


class TokenwiseCrossEntropy(nn.Module):
    """Cross-entropy over the last dimension and every leading position: [B, C] logits with [B]
    labels (images) and [B, T, C] with [B, T] (tokens) alike."""

    def __init__(self) -> None:
        super().__init__()
        self.ce = nn.CrossEntropyLoss()

    def forward(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.ce(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1))


class UserLoss(nn.Module):
    """loss._target_, given fp32 outputs (autocast may have produced fp16/bf16 ones)."""

    def __init__(self, loss: Any) -> None:
        super().__init__()
        self.loss = loss

    def forward(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.loss(out.float(), y)


def make_model(cfg: Config) -> nn.Module:
    if cfg.model._target_ is None:
        return build_model(cfg.model, InputSpec.from_data(cfg.data))
    model = targets.build(cfg, "model")
    if not isinstance(model, nn.Module):
        raise targets.WorkloadError(
            f"model._target_={cfg.model._target_} returned a {type(model).__name__}, not a torch.nn.Module"
        )
    return model


def make_dataset(cfg: Config, global_batch: int) -> Any:
    if cfg.data._target_ is None:
        return build_dataset(cfg.data, cfg.train.seed)
    dataset = targets.build(cfg, "data")
    targets.check_dataset(dataset, cfg.data._target_, global_batch)
    return dataset


def make_criterion(cfg: Config) -> nn.Module:
    return TokenwiseCrossEntropy() if cfg.loss._target_ is None else UserLoss(targets.build(cfg, "loss"))


def make_objective(cfg: Config) -> Objective:
    """How a step's loss is made (loss.name): from the model's output, or by the model itself."""
    if cfg.loss.name == "model":
        return ModelLoss(cfg.loss.targets_as)
    return LossOnOutput(make_criterion(cfg))


def workload_label(cfg: Config) -> str:
    parts = [f"{s}._target_={getattr(cfg, s)._target_}" for s in targets.SECTIONS if getattr(cfg, s)._target_]
    return ", ".join(parts)
