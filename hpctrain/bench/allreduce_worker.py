"""Runs under mpirun: times Horovod allreduce and plain MPI (mpi4py Allreduce) over message sizes,
in the same processes, and writes one JSON file (rank 0)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import horovod.torch as hvd
import numpy as np
import torch
from mpi4py import MPI

from hpctrain import records
from hpctrain.facts import mpi_library_version


def _time(fn, iters: int) -> float:
    fn()  # warm-up: buffers, Horovod negotiation
    MPI.COMM_WORLD.Barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    local = (time.perf_counter() - t0) / iters
    return MPI.COMM_WORLD.allreduce(local, op=MPI.MAX)  # a collective ends when its slowest rank ends


def measure(min_bytes: int, max_bytes: int, out: str) -> None:
    """Every rank calls this (under mpirun, or in srun tasks); rank 0 writes `out`."""
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
    hvd.init()  # reuses the MPI that mpi4py initialised
    n = hvd.size()
    rows = []
    for size, iters in sizes:
        t = torch.ones(size // 4)
        hvd_s = _time(lambda: hvd.allreduce(t, op=hvd.Sum, name=f"bench.{size}"), iters)
        rows.append({"n": n, "bytes": size, "iters": iters, "hvd_s": hvd_s, "mpi_s": mpi[size]})
    if hvd.rank() == 0:
        records.write(
            Path(out),
            records.new(
                records.AllreduceResult,
                n=n,
                mpi_library=mpi_library_version(),
                rows=[records.AllreduceRow(**r) for r in rows],
            ),
        )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--min-bytes", type=int, default=1024)
    ap.add_argument("--max-bytes", type=int, default=256 * 2**20)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    measure(args.min_bytes, args.max_bytes, args.out)


if __name__ == "__main__":
    main()
