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
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from hpctrain.analysis.tune import Effect, Knob
from hpctrain.config.schema import Config, DdpSettings, ParallelismConf
from hpctrain.engine.base import Engine, Sharding, StageReplicas, TensorParallel
from hpctrain.engine.world import CommError, RankInfo, export_torch_env
from hpctrain.errors import Problem

if TYPE_CHECKING:
    import torch
    from torch import nn

    from hpctrain.engine.clock import Mark, Stamped
    from hpctrain.records import Layout


class DdpEngine(Engine[DdpSettings], StageReplicas, Sharding, TensorParallel):
    torch_group = True
    settings = DdpSettings
    collective = "torch_s"
    grouping = "buckets"
    reduces_in_hooks = True
    stamp: Stamped  # DDP's communication hook, or FSDP's units' backward hooks

    @classmethod
    def problems(cls, cfg: Config) -> list[Problem]:
        p, mb = [], cfg.parallelism.bucket_mb
        if mb <= 0:
            p.append(
                Problem("parallelism.bucket_mb", f"must be > 0 (got {mb:g})", "e.g. parallelism.bucket_mb=25")
            )
        if cfg.parallelism.backend != ParallelismConf().backend:
            p.append(
                Problem(
                    "parallelism.backend",
                    f"{cfg.parallelism.backend.value} chooses Horovod's collectives; engine=ddp uses "
                    "Gloo on CPUs and NCCL on GPUs",
                    "drop parallelism.backend, or set parallelism.engine=horovod",
                )
            )
        return p

    @classmethod
    def grad_bucket_bytes(cls, cfg: Config) -> int:
        return int(cfg.parallelism.bucket_mb * 2**20)

    @classmethod
    def buffer_bytes(cls, cfg: Config, layout: Layout, grad_bytes: int) -> int:
        # DistributedDataParallel's buckets copy every gradient unless the gradients are views
        # of them (gradient_as_bucket_view); meshes (FSDP2, TP) have no buckets
        whole = layout.shard == 1 and layout.tp == 1 and not layout.pipelined
        copies = whole and layout.replicas > 1 and not cfg.parallelism.gradient_as_bucket_view
        return grad_bytes if copies else 0

    @classmethod
    def tune_knobs(cls, cfg: Config) -> list[Knob]:
        # buckets around DDP's 25 MB default; a communication hook that halves the bytes
        return [
            Knob("parallelism.bucket_mb", (1, 5, 25, 100), Effect.grouping),
            Knob("parallelism.compression", ("none", "fp16", "bf16"), Effect.wire),
            Knob("parallelism.gradient_as_bucket_view", (False, True)),
        ]

    @classmethod
    def needs_torch_store(cls, cfg: Config) -> bool:
        return True

    def init(self, layout: Layout) -> RankInfo:
        expected_size = layout.world_size
        import torch.distributed as dist

        self.dist = dist
        env = os.environ
        export_torch_env(env)
        from hpctrain.engine.clock import clock_for
        from hpctrain.engine.device import current_device, init_process_group

        # the rank entry bound the device before this (engine/device.py): NCCL's communicator is
        # created for it at once, never for cuda:0 by default
        device = current_device(self.run.device)
        self.device_type, self.clock = device.type, clock_for(device)
        init_process_group(device, self.run.rendezvous_s)
        size = self.size = dist.get_world_size()
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

    def wrap(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[nn.Module, Any]:
        from hpctrain.engine.ddp_wrap import Stamp, wrap_ddp

        self.stamp = Stamp(self.run.compression, self.clock)
        return wrap_ddp(self.own, model, self.stamp, self.device_type == "cuda"), optimizer

    def wrap_stage(
        self, pieces: list[nn.Module], optimizer: torch.optim.Optimizer, group: Any
    ) -> tuple[list[nn.Module], Any]:
        from hpctrain.engine.ddp_wrap import Stamp, wrap_ddp

        # torch.distributed.pipelining sees the DDP wrapper and syncs on the last micro-batch only
        self.stamp = Stamp(self.run.compression, self.clock, group)
        cuda = self.device_type == "cuda"
        return [wrap_ddp(self.own, p, self.stamp, cuda, stage=True) for p in pieces], optimizer

    def shard(self, model: nn.Module, layout: Layout, units: list[str], mesh: Any = None) -> nn.Module:
        from hpctrain.engine.fsdp_wrap import mesh_for, shard_model

        mesh = mesh if mesh is not None else mesh_for(self.device_type, layout.replicate, layout.shard)
        self.stamp = shard_model(self.run.shard, self.run.precision, model, mesh, units, self.clock)
        return model

    def device_mesh(self, layout: Layout) -> Any:
        from torch.distributed.device_mesh import init_device_mesh

        dims = layout.mesh_dims
        return init_device_mesh(
            self.device_type, tuple(n for _, n in dims), mesh_dim_names=tuple(d for d, _ in dims)
        )

    def split(self, model: nn.Module, how: Callable[[nn.Module], nn.Module]) -> nn.Module:
        from hpctrain.engine.ddp_wrap import Stamp

        # no data-parallel wrapper (yet): nothing syncs gradients between replicas, and the
        # tensor-parallel collectives run inside forward and backward
        self.stamp = Stamp("none", self.clock)
        return how(model)

    def broadcast_initial(self, model: nn.Module) -> None:
        pass  # DistributedDataParallel broadcast rank 0's parameters and buffers when it wrapped them

    def micro_batch(self, model: nn.Module, last: bool) -> AbstractContextManager[Any]:
        """Asked of what syncs the model's gradients (what wrap or shard returned), not of a mode."""
        from torch.distributed.fsdp import FSDPModule
        from torch.nn.parallel import DistributedDataParallel

        if isinstance(model, FSDPModule):  # FSDP2: no reduce-scatter (nor HSDP all-reduce) until the last
            model.set_requires_gradient_sync(last)
        elif isinstance(model, DistributedDataParallel) and not last:
            return model.no_sync()
        return contextlib.nullcontext()  # the last micro-batch, or tensor parallelism alone (no replicas)

    def vote(self, flag: bool, step: int) -> Any:
        import torch

        if self.size == 1:
            return flag  # nobody to agree with: no collective (a step's kernels on one GPU)
        # filled on the device: no host-to-device copy, which would wait for the stream
        t = torch.full((1,), float(flag), device=self.device_type)
        return t, self.dist.all_reduce(t, op=self.dist.ReduceOp.MAX, async_op=True)

    def vote_result(self, handle: Any) -> bool:
        if isinstance(handle, bool):
            return handle
        t, work = handle
        work.wait()
        return float(t[0]) > 0

    def wait_gradients(self, optimizer: Any) -> Mark | None:
        # backward() has waited for every bucket (FSDP2: every reduce-scatter); what it spent
        # after the last became ready (no stamp: a model sharded as one unit, not measured)
        return self.stamp.take()

    def barrier(self, name: str) -> None:
        self.dist.barrier()

    def allreduce_now(self, t: torch.Tensor, name: str) -> None:
        self.dist.all_reduce(t)

    def allgather_object(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * self.dist.get_world_size()
        self.dist.all_gather_object(out, obj)
        return out

    def environment(self) -> dict[str, Any]:
        return {
            "engine": self.name,
            "backend": self.dist.get_backend(),
            "torch_distributed": {
                "gloo": self.dist.is_gloo_available(),
                "nccl": self.dist.is_nccl_available(),
                "mpi": self.dist.is_mpi_available(),
            },
        }

    def shutdown(self) -> None:
        self.dist.barrier()  # no rank tears the group down while another still talks to it
        self.dist.destroy_process_group()
