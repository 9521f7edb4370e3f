"""DDP's wrapper on the ranks, with the communication hook that times the buckets (the DDP
engine, engine/ddp.py, imports this only on a rank: planning never loads torch.distributed)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

from hpctrain.config.schema import DdpSettings
from hpctrain.engine.clock import Clock, Mark

HOOKS = {
    "none": default_hooks.allreduce_hook,
    "fp16": default_hooks.fp16_compress_hook,
    "bf16": default_hooks.bf16_compress_hook,
}


class Stamp:
    """The communication hook's state: the clock's mark of when the latest bucket became ready
    (on CUDA an event on the compute stream, reached when the bucket's gradients are computed)."""

    def __init__(self, compression: str, clock: Clock, group: Any = None) -> None:
        self.hook = HOOKS[compression]
        self.clock = clock
        self.group = group  # None: the default (world) process group
        self.ready: Mark | None = None


def _timed_hook(state, bucket):  # type: ignore[no-untyped-def]  # DDP checks real annotations; ours are strings
    state.ready = state.clock.mark()
    return state.hook(state.group, bucket)


class StageDDP(DistributedDataParallel):
    """DDP for a pipeline stage: forward passes never arm the gradient sync (each micro-batch's
    would, and DDP's first-iteration bucket rebuild would then count every parameter once per
    micro-batch); torch.distributed.pipelining arms it explicitly before the last micro-batch's
    backward pass (PipelineStage.backward_maybe_with_nosync)."""

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        with self.no_sync():
            return super().forward(*args, **kwargs)


def wrap_ddp(
    p: DdpSettings, model: nn.Module, stamp: Stamp, cuda: bool, stage: bool = False
) -> DistributedDataParallel:
    """`model` in DDP over the stamp's process group, its buckets timed by the stamp."""
    cls = StageDDP if stage else DistributedDataParallel
    ddp = cls(
        model,
        device_ids=[torch.cuda.current_device()] if cuda else None,
        bucket_cap_mb=p.bucket_mb,
        gradient_as_bucket_view=p.gradient_as_bucket_view,
        static_graph=p.static_graph,
        process_group=stamp.group,
    )
    ddp.register_comm_hook(stamp, _timed_hook)
    return ddp
