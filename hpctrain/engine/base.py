"""The engine interface the training step and loop use."""

from __future__ import annotations

from abc import ABC, abstractmethod
from contextlib import AbstractContextManager
from typing import Any, ClassVar

import torch
from torch import nn

from ..config.schema import Config
from ..train.comm import RankInfo


class Engine(ABC):
    name: ClassVar[str]

    @abstractmethod
    def init(self, cfg: Config, expected_size: int) -> RankInfo:
        """Join the world the launcher started; check its size against the plan."""

    @abstractmethod
    def wrap(self, cfg: Config, model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[nn.Module, Any]:
        """The model to call and the optimizer to step, with gradient averaging attached."""

    @abstractmethod
    def wrap_stage(
        self, cfg: Config, pieces: list[nn.Module], optimizer: torch.optim.Optimizer, group: Any
    ) -> tuple[list[nn.Module], Any]:
        """Hybrid parallelism: this rank's pipeline pieces (to run) and optimizer (to step), with
        their gradients averaged over the stage's replicas (`group`: their torch process group)
        after the last micro-batch's backward pass."""

    @abstractmethod
    def broadcast_initial(self, model: nn.Module, optimizer: Any) -> None:
        """A fresh start: every rank takes rank 0's weights and optimizer state."""

    @abstractmethod
    def micro_batch(self, model: nn.Module, last: bool) -> AbstractContextManager[Any]:
        """Around one micro-batch's forward and backward (accumulation: only the last syncs)."""

    @abstractmethod
    def vote(self, flag: bool, step: int) -> Any:
        """Start agreeing on a stop (max over ranks); the handle goes to vote_result."""

    @abstractmethod
    def vote_result(self, handle: Any) -> bool: ...

    @abstractmethod
    def wait_gradients(self, optimizer: Any, backward_end: float) -> float:
        """Block until the averaged gradients are in place. Returns the part of the backward pass
        (ending at `backward_end`) that already waited for communication, in seconds; the caller
        times the rest of this call as exposed communication too."""

    @abstractmethod
    def optimizer_step(self, optimizer: Any, scaler: torch.amp.GradScaler | None) -> None: ...

    @abstractmethod
    def barrier(self, name: str) -> None: ...

    @abstractmethod
    def allreduce_now(self, t: torch.Tensor, name: str) -> None:
        """A blocking sum over every rank, with the collective the engine averages gradients with."""

    @abstractmethod
    def allgather_object(self, obj: Any) -> list[Any]: ...

    @abstractmethod
    def environment(self) -> dict[str, Any]:
        """env.json's engine part: versions, build, what it runs on."""

    @abstractmethod
    def shutdown(self) -> None: ...


def step_optimizer(optimizer: Any, scaler: torch.amp.GradScaler | None) -> None:
    """optimizer.step(), through the gradient scaler when fp16 uses one."""
    if scaler is not None:
        scaler.unscale_(optimizer)
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
