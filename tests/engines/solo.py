"""A third engine, for the tests only: each rank trains alone, with no communication at all (the
ceiling a communicating engine is measured against). Adding it to hpctrain takes this module and
one registration line: engine.registry.register_engine("solo", "tests.engines.solo:SoloEngine")
(or one line in registry.ENGINES for an engine that ships with hpctrain)."""

from __future__ import annotations

import socket
from typing import Any

import torch
from torch import nn

from hpctrain.config.schema import Config
from hpctrain.engine.base import Engine
from hpctrain.engine.world import CommError, RankInfo
from hpctrain.errors import Problem
from hpctrain.records import Layout


class SoloEngine(Engine[None]):
    collective = "mpi_s"  # it runs no collective; the roofline may place it on the wire alone
    grouping = "fusion"

    @classmethod
    def problems(cls, cfg: Config) -> list[Problem]:
        if cfg.cluster.world_size == 1:
            return []
        return [
            Problem("cluster.ranks", "the solo engine averages nothing: one rank only", "set cluster.ranks=1")
        ]

    @classmethod
    def rank_env(cls, cfg: Config) -> dict[str, str]:
        return {"HPCTRAIN_SOLO": "1"}

    def init(self, layout: Layout) -> RankInfo:
        if layout.world_size != 1:
            raise CommError(f"the solo engine runs one rank, not {layout.world_size}")
        return RankInfo(0, 1, 0, 1, 0, 1, socket.gethostname())

    def wrap(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[nn.Module, Any]:
        return model, optimizer

    def vote(self, flag: bool, step: int) -> Any:
        return flag

    def vote_result(self, handle: Any) -> bool:
        return bool(handle)

    def barrier(self, name: str) -> None:
        return None

    def allreduce_now(self, t: torch.Tensor, name: str) -> None:
        return None  # the sum over one rank

    def allgather_object(self, obj: Any) -> list[Any]:
        return [obj]

    def environment(self) -> dict[str, Any]:
        return {"engine": self.name}

    def shutdown(self) -> None:
        return None
