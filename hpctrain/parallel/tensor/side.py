"""Tensor parallelism on the ranks (train/dims.py: LayerSplit): the model split by the plan in
force over the mesh's "tp" dimension (split.py), one warm-up step's collectives counted (comm.py)
and, after training, sent again alone over the same group and timed."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from torch import nn

from hpctrain.parallel.tensor.figures import TensorRank
from hpctrain.parallel.tensor.plan import plan_for
from hpctrain.parallel.tensor.split import DIVIDE_HINT, piece_plan, split_model

if TYPE_CHECKING:
    import torch

    from hpctrain.config.schema import Config
    from hpctrain.parallel.tensor.comm import TpTraffic

MESH_DIM = "tp"


class TensorSplit:
    key = "parallelism.tp.plan"
    hint = DIVIDE_HINT

    def __init__(self, cfg: Config) -> None:
        tp = cfg.parallelism.tp
        self.sequence = bool(tp.sequence_parallel)
        self.plan = plan_for(cfg.model, dict(tp.plan), self.sequence)
        self.divide = [str(a) for a in tp.divide]
        self.group: Any = None  # the tensor-parallel ranks' process group, once split
        self.traffic: TpTraffic | None = None
        self.replay_s = 0.0

    def split(self, module: nn.Module, mesh: Any, whole: bool) -> nn.Module:
        tp_mesh = mesh[MESH_DIM]
        plan, divide = (self.plan, self.divide) if whole else piece_plan(self.plan, self.divide, module)
        if not plan:  # a pipeline piece holding none of the plan's modules
            return module
        if hasattr(tp_mesh, "get_group"):
            self.group = tp_mesh.get_group()
        return split_model(module, tp_mesh, plan, self.sequence, divide)

    @contextlib.contextmanager
    def counting(self) -> Iterator[None]:
        from hpctrain.parallel.tensor.comm import CollectiveLog  # DTensor's debug mode: only where TP runs

        with warnings.catch_warnings(), CollectiveLog() as log:
            # the debug mode's module tracker hooks the first block, whose input needs no gradient
            warnings.filterwarnings(
                "ignore", message="Full backward hook is firing when gradients are computed"
            )
            yield
        self.traffic = log.traffic()

    def after_training(self, device: torch.device) -> None:
        if self.traffic is not None and self.group is not None:  # the same on every rank
            from hpctrain.parallel.tensor.comm import replay

            self.replay_s = replay(self.traffic, self.group, device)

    def figures(self) -> dict[str, dict[str, Any]]:
        t = self.traffic
        if t is None:
            return {}
        return {TensorRank.KEY: {"messages": t.messages, "bytes": t.allreduce_bytes, "comm_s": self.replay_s}}
