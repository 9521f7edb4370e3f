"""DDP's wrapper on the ranks, and the stamp of when the gradients were ready (the DDP engine,
engine/ddp.py, imports this only on a rank: planning never loads torch.distributed).

Without compression DDP reduces its buckets in C++ and each gradient, once accumulated, marks the
time (a post-accumulate-grad hook): the last mark is when the last bucket became ready. A Python
communication hook would time the buckets themselves, but it takes DDP off its C++ path for every
bucket: 4% of a step of the communication-bound MLP on 2 CPU ranks (hpctrain bench overhead
--model mlp --engines ddp: 0.957 of the hand-written loop with the hook, 0.994 without; torch's
builtin ALLREDUCE hook 0.927). Compression needs the hook (fp16/bf16_compress_hook), which marks."""

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
    """The clock's mark of when the latest gradient (or, with compression, bucket) became ready
    (on CUDA an event on the compute stream, reached when the gradients are computed); the state
    of the communication hook when there is one."""

    def __init__(self, compression: str, clock: Clock, group: Any = None) -> None:
        self.compression = compression
        self.hook = HOOKS[compression]
        self.clock = clock
        self.group = group  # None: the default (world) process group
        self.ready: Mark | None = None

        self.expected = 0  # gradients a backward pass accumulates (the parameters watched)
        self.seen = 0

    def watch(self, params: list[nn.Parameter]) -> None:
        """Mark when the last of these gradients has been accumulated: one mark per backward pass
        (on CUDA one event, not one per parameter on a host-bound step)."""
        for param in params:
            param.register_post_accumulate_grad_hook(self.accumulated)
        self.expected += len(params)

    def accumulated(self, _: torch.Tensor) -> None:
        self.seen += 1
        if self.seen >= self.expected:
            self.ready, self.seen = self.clock.mark(), 0

    def take(self) -> Mark | None:
        """The latest mark, once (a backward pass cut short leaves no count behind)."""
        ready, self.ready, self.seen = self.ready, None, 0
        return ready


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
    if stamp.compression == "none":  # DDP's own C++ allreduce; the gradients mark when they are ready
        stamp.watch([p for p in model.parameters() if p.requires_grad])
    else:
        ddp.register_comm_hook(stamp, _timed_hook)
    return ddp
