"""The engine axis: what averages the gradients across ranks.

    horovod   Horovod's DistributedOptimizer (ring-allreduce over MPI or Gloo; NCCL on GPUs)
    ddp       torch.distributed DistributedDataParallel (Gloo on CPUs, NCCL on GPUs)

An engine initialises from the launcher's environment, wraps the model and optimizer, and
reports how long each step waited for gradient communication after its backward pass (the
exposed communication), each in the way its library allows (see the README). The training step
(train/step.py) and loop never ask which engine they have.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # importing the package stays light: rank.py reads dist_env before torch loads
    from .base import Engine


def engine_for(name: str) -> Engine:
    if name == "ddp":
        from .ddp import DdpEngine

        return DdpEngine()
    from .horovod import HorovodEngine

    return HorovodEngine()
