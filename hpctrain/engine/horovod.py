"""Horovod: hvd.DistributedOptimizer allreduces each gradient as soon as the backward pass has
produced it (fused into buffers of HOROVOD_FUSION_THRESHOLD bytes every HOROVOD_CYCLE_TIME).
Exposed communication is the time optimizer.synchronize() blocks after the backward pass."""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager
from typing import Any

import torch
from torch import nn

from ..config.schema import Config
from ..train.comm import RankInfo, init_horovod, rank_info
from .base import Engine, step_optimizer


class HorovodEngine(Engine):
    name = "horovod"

    def init(self, cfg: Config, expected_size: int) -> RankInfo:
        from ..parallel import layout_for

        self.backend = str(cfg.parallelism.backend)
        # hybrid: one process set per pipeline stage, holding its replicas (registered at init)
        layout = layout_for(cfg, expected_size)
        groups = [layout.replica_ranks(s) for s in range(layout.stages)] if layout.pipelined else []
        import horovod.torch as hvd

        sets = [hvd.ProcessSet(g) for g in groups]
        self.hvd = init_horovod(self.backend, expected_size=expected_size, process_sets=sets)
        rank = self.hvd.rank()
        self.process_set = next((ps for ps, g in zip(sets, groups) if rank in g), None)
        return rank_info(self.hvd)

    def wrap_stage(
        self, cfg: Config, pieces: list[nn.Module], optimizer: torch.optim.Optimizer, group: Any
    ) -> tuple[list[nn.Module], Any]:
        hvd = self.hvd
        compression = hvd.Compression.fp16 if cfg.parallelism.compression == "fp16" else hvd.Compression.none
        named = [(f"{i}.{n}", p) for i, piece in enumerate(pieces) for n, p in piece.named_parameters()]
        wrapped = hvd.DistributedOptimizer(
            optimizer,
            named_parameters=named,
            compression=compression,
            # every micro-batch's backward pass accumulates into the gradients; the last one sends
            backward_passes_per_step=cfg.parallelism.microbatches,
            op=hvd.Average,
            process_set=self.process_set,
        )
        return pieces, wrapped

    def wrap(self, cfg: Config, model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[nn.Module, Any]:
        hvd = self.hvd
        compression = hvd.Compression.fp16 if cfg.parallelism.compression == "fp16" else hvd.Compression.none
        wrapped = hvd.DistributedOptimizer(
            optimizer,
            named_parameters=model.named_parameters(),
            compression=compression,
            backward_passes_per_step=cfg.parallelism.backward_passes_per_step,
            op=hvd.Average,
        )
        return model, wrapped

    def broadcast_initial(self, model: nn.Module, optimizer: Any) -> None:
        self.hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        self.hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    def micro_batch(self, model: nn.Module, last: bool) -> AbstractContextManager[Any]:
        # backward_passes_per_step: Horovod counts the passes and allreduces after the last
        return contextlib.nullcontext()

    def vote(self, flag: bool, step: int) -> Any:
        # a one-element allreduce that Horovod fuses with the gradients
        return self.hvd.allreduce_async(
            torch.tensor([float(flag)]), op=self.hvd.Max, name=f"hpctrain.stop.{step}"
        )

    def vote_result(self, handle: Any) -> bool:
        return float(self.hvd.synchronize(handle)[0]) > 0

    def wait_gradients(self, optimizer: Any, backward_end: float) -> float:
        optimizer.synchronize()  # blocks until every gradient allreduce has finished
        return 0.0

    def optimizer_step(self, optimizer: Any, scaler: torch.amp.GradScaler | None) -> None:
        with optimizer.skip_synchronize():
            step_optimizer(optimizer, scaler)

    def barrier(self, name: str) -> None:
        self.hvd.allreduce(torch.zeros(1), name=name)

    def allreduce_now(self, t: torch.Tensor, name: str) -> None:
        self.hvd.allreduce(t, op=self.hvd.Sum, name=name)

    def allgather_object(self, obj: Any) -> list[Any]:
        return list(self.hvd.allgather_object(obj))

    def environment(self) -> dict[str, Any]:
        import horovod

        hvd = self.hvd
        rec: dict[str, Any] = {
            "engine": self.name,
            "horovod": horovod.__version__,
            "backend": self.backend,
            "horovod_build": {
                name: bool(getattr(hvd, f"{name}_built")())
                for name in ("mpi", "gloo", "nccl", "cuda", "rocm", "ddl", "ccl")
            },
            # what Horovod runs on, as it reports it (the build may have both controllers)
            "horovod_runtime": {
                "mpi_enabled": bool(hvd.mpi_enabled()),
                "gloo_enabled": bool(hvd.gloo_enabled()),
            },
        }
        if self.backend == "mpi":
            from ..facts import mpi_library_version

            rec["mpi_library"] = mpi_library_version()
            rec["mpi4py"] = __import__("mpi4py").__version__
        return rec

    def shutdown(self) -> None:
        self.hvd.shutdown()
