"""The allreduce benchmark as a workload (bench.allreduce=true): every rank, started by mpirun or
srun like any run, times plain MPI (mpi4py Allreduce, host buffers), torch.distributed all_reduce
(Gloo; NCCL on GPUs) and Horovod allreduce over message sizes, in the same processes, one library
after the other; rank 0 writes allreduce-n{N}.json into the run directory.

On GPUs each rank binds its device first (engine/device.py), and torch.distributed and Horovod
reduce device tensors (NCCL), which is what training averages gradients with; Horovod built
without NCCL is refused there rather than timed on host tensors that training would not use."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import horovod.torch as hvd
import numpy as np
import torch
from mpi4py import MPI

from hpctrain import heap, records
from hpctrain.config.schema import Config
from hpctrain.engine.device import bind_device, init_process_group
from hpctrain.engine.horovod import horovod_without_nccl
from hpctrain.engine.world import CommError, export_torch_env
from hpctrain.facts import mpi_library_version


def _time(op: Callable[[], object], iters: int, gpu: bool = False) -> float:
    """Seconds per call of `op`, the slowest rank's; on GPUs the device is waited for (a call
    only queues work on NCCL's stream)."""

    def fn() -> None:
        op()
        if gpu:
            torch.cuda.synchronize()

    fn()  # warm-up: buffers, Horovod negotiation, NCCL communicators
    MPI.COMM_WORLD.Barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    local = (time.perf_counter() - t0) / iters
    return MPI.COMM_WORLD.allreduce(local, op=MPI.MAX)  # a collective ends when its slowest rank ends


def _torch_distributed(
    sizes: list[tuple[int, int]], device: torch.device, rendezvous_s: float = 0.0
) -> dict[int, tuple[float, float, float]]:
    """torch.distributed's all_reduce (what DDP averages with), all_gather_into_tensor and
    reduce_scatter_tensor (what FSDP gathers parameters and reduces gradients with), on its own
    process group: (all-reduce, all-gather, reduce-scatter) seconds by the full tensor's bytes."""
    import torch.distributed as dist

    export_torch_env()
    gpu = device.type == "cuda"
    init_process_group(device, rendezvous_s)  # within train.stall_timeout_s, as training's
    n = dist.get_world_size()
    out = {}
    for size, iters in sizes:
        whole = torch.ones((size // 4) // n * n, device=device)  # every rank's part the same size
        part = torch.ones(whole.numel() // n, device=device)

        def timed(op: Callable[[], object]) -> float:
            return _time(op, iters, gpu)

        out[size] = (
            timed(lambda: dist.all_reduce(whole)),
            timed(lambda: dist.all_gather_into_tensor(whole, part)),
            timed(lambda: dist.reduce_scatter_tensor(part, whole)),
        )
    dist.barrier()
    dist.destroy_process_group()
    return out


def measure(
    min_bytes: int, max_bytes: int, out: str, device: torch.device, rendezvous_s: float = 0.0
) -> None:
    """Every rank calls this (under mpirun, or in srun tasks) on its bound `device`; rank 0 writes
    `out`."""
    comm = MPI.COMM_WORLD
    sizes = []
    size = min_bytes
    while size <= max_bytes:
        sizes.append((size, int(max(3, min(100, 2**26 // size)))))  # ~64 MiB per size, >= 3 calls
        size *= 2
    # Plain MPI first, before Horovod's background thread exists to compete for the cores.
    mpi = {}
    for size, iters in sizes:
        a, b = np.ones(size // 4, np.float32), np.empty(size // 4, np.float32)
        mpi[size] = _time(lambda: comm.Allreduce(a, b, op=MPI.SUM), iters)
    dist_s = _torch_distributed(sizes, device, rendezvous_s)
    hvd.init()  # reuses the MPI that mpi4py initialised
    gpu = device.type == "cuda"
    if gpu and not hvd.nccl_built():
        raise CommError(horovod_without_nccl())
    n = hvd.size()
    rows = []
    for size, iters in sizes:
        t = torch.ones(size // 4, device=device)
        hvd_s = _time(lambda: hvd.allreduce(t, op=hvd.Sum, name=f"bench.{size}"), iters, gpu)
        rows.append(
            {
                "n": n,
                "bytes": size,
                "iters": iters,
                "hvd_s": hvd_s,
                "mpi_s": mpi[size],
                "torch_s": dist_s[size][0],
                "allgather_s": dist_s[size][1],
                "reduce_scatter_s": dist_s[size][2],
            }
        )
    if hvd.rank() == 0:
        records.write(
            Path(out),
            records.new(
                records.AllreduceResult,
                n=n,
                mpi_library=mpi_library_version(),
                device=str(device.type),
                rows=[records.AllreduceRow(**r) for r in rows],
            ),
        )


def run_allreduce(cfg: Config, run_dir: Path) -> None:
    """This rank's part of the benchmark; rank 0 writes the result into the run directory."""
    b = cfg.bench
    device = bind_device(cfg.train.device, os.environ)  # before the first collective
    heap.release()  # the collector held since the rank started (hpctrain/heap.py)
    out = str(run_dir / records.allreduce_file(cfg.cluster.world_size))
    measure(b.min_bytes, b.max_mb * 2**20, out, device, cfg.train.stall_timeout_s)
