"""torch.distributed DistributedDataParallel, initialised from the launcher's variables (mpirun's
OMPI_COMM_WORLD_*, srun's SLURM_*) without torchrun: Gloo on CPUs, NCCL on GPUs.

DDP allreduces gradient buckets during the backward pass and makes backward() itself wait for
the last of them. Exposed communication is therefore measured inside backward: a communication
hook stamps the moment each bucket's gradients are ready; the last bucket is ready when the
backward computation is done, and everything backward() takes after that is waiting for
communication (plus, as for Horovod, any wait after it).
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from contextlib import AbstractContextManager
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

from hpctrain.config.schema import Config
from hpctrain.engine.base import Engine, StageReplicas
from hpctrain.engine.world import CommError, RankInfo, export_torch_env
from hpctrain.errors import Problem
from hpctrain.facts import wants_cuda

HOOKS = {
    "none": default_hooks.allreduce_hook,
    "fp16": default_hooks.fp16_compress_hook,
    "bf16": default_hooks.bf16_compress_hook,
}


class _Stamp:
    """The communication hook's state: when the latest bucket became ready."""

    def __init__(self, hook: Any, group: Any = None) -> None:
        self.hook = hook
        self.group = group  # None: the default (world) process group
        self.ready = 0.0


def _timed_hook(state, bucket):  # type: ignore[no-untyped-def]  # DDP checks real annotations; ours are strings
    state.ready = time.perf_counter()
    return state.hook(state.group, bucket)


class StageDDP(DistributedDataParallel):
    """DDP for a pipeline stage: forward passes never arm the gradient sync (each micro-batch's
    would, and DDP's first-iteration bucket rebuild would then count every parameter once per
    micro-batch); torch.distributed.pipelining arms it explicitly before the last micro-batch's
    backward pass (PipelineStage.backward_maybe_with_nosync)."""

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        with self.no_sync():
            return super().forward(*args, **kwargs)


class DdpEngine(Engine, StageReplicas):
    settings = ("bucket_mb", "gradient_as_bucket_view", "static_graph")
    collective = "torch_s"
    grouping = "buckets"

    @classmethod
    def problems(cls, cfg: Config) -> list[Problem]:
        mb = cfg.parallelism.bucket_mb
        if mb > 0:
            return []
        return [
            Problem("parallelism.bucket_mb", f"must be > 0 (got {mb:g})", "e.g. parallelism.bucket_mb=25")
        ]

    @classmethod
    def grad_bucket_bytes(cls, cfg: Config) -> int:
        return int(cfg.parallelism.bucket_mb * 2**20)

    @classmethod
    def needs_torch_store(cls, cfg: Config) -> bool:
        return True

    def init(self, cfg: Config, expected_size: int) -> RankInfo:
        env = os.environ
        export_torch_env(env)
        self.device_type = "cuda" if wants_cuda(cfg.train.device) else "cpu"
        backend = "nccl" if self.device_type == "cuda" else "gloo"
        dist.init_process_group(backend, timeout=timedelta(minutes=30))
        size = dist.get_world_size()
        if size != expected_size:
            raise CommError(
                f"torch.distributed sees a world of {size} rank(s) but the plan has {expected_size}; "
                "the launcher and the process group disagree"
            )
        rank, local_size = dist.get_rank(), int(env["LOCAL_WORLD_SIZE"])
        return RankInfo(
            rank,
            size,
            int(env["LOCAL_RANK"]),
            local_size,
            rank // local_size,
            size // local_size,
            socket.gethostname(),
        )

    def wrap(self, cfg: Config, model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[nn.Module, Any]:
        self.stamp = _Stamp(HOOKS[str(cfg.parallelism.compression)])
        return self._ddp(cfg, model, None), optimizer

    def wrap_stage(
        self, cfg: Config, pieces: list[nn.Module], optimizer: torch.optim.Optimizer, group: Any
    ) -> tuple[list[nn.Module], Any]:
        # torch.distributed.pipelining sees the DDP wrapper and syncs on the last micro-batch only
        self.stamp = _Stamp(HOOKS[str(cfg.parallelism.compression)], group)
        return [self._ddp(cfg, p, group, StageDDP) for p in pieces], optimizer

    def _ddp(
        self,
        cfg: Config,
        model: nn.Module,
        group: Any,
        cls: type[DistributedDataParallel] = DistributedDataParallel,
    ) -> DistributedDataParallel:
        p = cfg.parallelism
        ddp = cls(
            model,
            device_ids=[torch.cuda.current_device()] if self.device_type == "cuda" else None,
            bucket_cap_mb=p.bucket_mb,
            gradient_as_bucket_view=p.gradient_as_bucket_view,
            static_graph=p.static_graph,
            process_group=group,
        )
        ddp.register_comm_hook(self.stamp, _timed_hook)
        return ddp

    def broadcast_initial(self, model: nn.Module, optimizer: Any) -> None:
        pass  # DistributedDataParallel broadcast rank 0's parameters and buffers when it wrapped them

    def micro_batch(self, model: nn.Module, last: bool) -> AbstractContextManager[Any]:
        return contextlib.nullcontext() if last else model.no_sync()  # type: ignore[operator]

    def vote(self, flag: bool, step: int) -> Any:
        t = torch.tensor([float(flag)], device=self.device_type)
        return t, dist.all_reduce(t, op=dist.ReduceOp.MAX, async_op=True)

    def vote_result(self, handle: Any) -> bool:
        t, work = handle
        work.wait()
        return float(t[0]) > 0

    def wait_gradients(self, optimizer: Any, backward_end: float) -> float:
        # backward() has waited for every bucket; what it spent after the last became ready
        return max(0.0, backward_end - self.stamp.ready)

    def barrier(self, name: str) -> None:
        dist.barrier()

    def allreduce_now(self, t: torch.Tensor, name: str) -> None:
        dist.all_reduce(t)

    def allgather_object(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(out, obj)
        return out

    def environment(self) -> dict[str, Any]:
        return {
            "engine": self.name,
            "backend": dist.get_backend(),
            "torch_distributed": {
                "gloo": dist.is_gloo_available(),
                "nccl": dist.is_nccl_available(),
                "mpi": dist.is_mpi_available(),
            },
        }

    def shutdown(self) -> None:
        dist.barrier()  # no rank tears the group down while another still talks to it
        dist.destroy_process_group()
