"""The pre-flight check on the ranks (cluster.preflight.enabled), after the world is up and
before the first step: each rank times a GEMM at the run's precision on its device and a ring
exchange with the next rank; every rank then judges the nodes from all ranks' probes
(analysis/preflight.py), rank 0 appends the verdicts to preflight.json, and a bad node ends the
run before any step, naming the node, its figures, the reference and the tolerance.

The ring goes over torch.distributed where the ranks meet there (ddp, fsdp, TP: Gloo or NCCL,
the links training uses), else over MPI where mpirun or srun started them (Horovod), else the
links are not measured (said in the record)."""

from __future__ import annotations

import json
import os
import socket
import statistics
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from hpctrain.analysis.preflight import Probe, Verdict, judge, reference_of
from hpctrain.config.schema import Config
from hpctrain.records.preflight import PREFLIGHT, reference_checks

# debug.slow_node: that node's GEMMs take this many times as long. Far enough from the others that
# a check on a loaded machine still sees it: with tolerance 0.7 and two nodes, 10x passed the slow
# node once the other measured half its speed (a fresh-clone suite run); 50x needs a 9x slowdown
SLOW_FACTOR = 50.0
GEMM_N = {"cuda": 4096, "cpu": 512}
LINK_BYTES = 4 * 2**20  # the large message of the link probe (the small one is one element)


class PreflightFailed(RuntimeError):
    """A node failed the pre-flight check (not restarted in place: the same nodes would fail)."""


def gemm_tflops(device: torch.device, precision: str, slow: bool, seconds: float = 0.2) -> float:
    """A square GEMM at the run's precision, timed on the device (synchronised on a GPU)."""
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32)
    if device.type == "cpu" and dtype == torch.float16:
        dtype = torch.float32  # CPUs have no fast fp16 GEMM; the run computes in fp32 there
    n = GEMM_N.get(device.type, 512)
    g = torch.Generator(device=device)  # its own: the run's seeded streams are left as they are
    a = torch.randn(n, n, dtype=dtype, device=device, generator=g)
    b = torch.randn(n, n, dtype=dtype, device=device, generator=g)
    _sync(device, a @ b)  # warm-up: BLAS threads, cuBLAS handles, packing buffers
    calls, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds or calls < 3:
        t0 = time.perf_counter()
        _sync(device, a @ b)
        if slow:  # a node that really runs slower: its process is off the core for the rest
            time.sleep((SLOW_FACTOR - 1) * (time.perf_counter() - t0))
        calls += 1
    return 2 * n**3 * calls / elapsed / 1e12


def _sync(device: torch.device, _: torch.Tensor) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def ring_link(device: torch.device, repeats: int = 5) -> tuple[float, float]:
    """(alpha s, GB/s) of this rank's link to the next rank, each rank sending to the next and
    receiving from the one before at once; (0, 0) where the ranks have no point-to-point path."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        n, me = dist.get_world_size(), dist.get_rank()

        def exchange(buf: torch.Tensor, into: torch.Tensor) -> None:
            for req in (dist.isend(buf, (me + 1) % n), dist.irecv(into, (me - 1) % n)):
                if req is not None:  # None: this rank is not in the group (never, in the world)
                    req.wait()
            _sync(device, into)

        return _fit(exchange, device, repeats)
    if os.environ.get("OMPI_COMM_WORLD_SIZE") or os.environ.get("PMIX_RANK"):
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
        if comm.Get_size() > 1:
            n, me = comm.Get_size(), comm.Get_rank()

            def exchange(buf: torch.Tensor, into: torch.Tensor) -> None:
                comm.Sendrecv(buf.numpy(), (me + 1) % n, recvbuf=into.numpy(), source=(me - 1) % n)

            return _fit(exchange, torch.device("cpu"), repeats)
    return 0.0, 0.0


def _fit(exchange: Any, device: torch.device, repeats: int) -> tuple[float, float]:
    """alpha from one element, beta from LINK_BYTES (the allreduce probe's two-point fit)."""
    times = []
    for size in (1, LINK_BYTES // 4):
        buf, into = torch.ones(size, device=device), torch.empty(size, device=device)
        exchange(buf, into)  # warm-up: connections, buffers
        runs = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            exchange(buf, into)
            runs.append(time.perf_counter() - t0)
        times.append(statistics.median(runs))
    alpha, beta_s = times[0], max(times[1] - times[0], 1e-9)
    return alpha, (LINK_BYTES - 4) / beta_s / 1e9


def preflight(cfg: Config, rank: int, device: torch.device, allgather: Any, run_dir: Path) -> list[Verdict]:
    """Probe, share, judge; rank 0 records. Raises PreflightFailed on every rank when a node is bad."""
    host = socket.gethostname()
    tflops = gemm_tflops(device, str(cfg.precision.name), slow=cfg.debug.slow_node == host)
    alpha, gbps = ring_link(device)
    mine = asdict(Probe(rank, host, tflops, "", alpha, gbps))
    ordered = sorted((Probe(**p) for p in allgather(mine)), key=lambda p: p.rank)
    probes = [  # each rank's link goes to the next rank's host
        Probe(p.rank, p.host, p.tflops, ordered[(i + 1) % len(ordered)].host, p.link_alpha_s, p.link_gbps)
        for i, p in enumerate(ordered)
    ]
    pf = cfg.cluster.preflight
    ref = reference_of(reference_checks(Path(pf.reference)), pf.reference) if pf.reference else None
    verdicts = judge(probes, pf.tolerance, pf.min_tflops, pf.min_link_gbps, ref)
    if rank == 0:
        record(run_dir, probes, verdicts, pf.tolerance, str(cfg.precision.name), device.type)
    bad = [v for v in verdicts if v.bad]
    if bad:
        names = ",".join(v.host for v in bad)
        raise PreflightFailed(
            f"pre-flight check: node(s) {names} bad: " + "; ".join(v.line() for v in bad)
            + f" (preflight.json); exclude them: cluster.exclude=[{names}]"
        )  # fmt: skip
    return verdicts


def record(
    run_dir: Path, probes: list[Probe], verdicts: list[Verdict], tolerance: float, precision: str, device: str
) -> None:
    """One line of preflight.json per check (a resubmitted run checks again)."""
    line = {
        "time": time.time(),
        "tolerance": tolerance,
        "precision": precision,  # a later run holds its nodes to this one's only at the same one
        "device": device,
        "links_measured": any(p.link_gbps > 0 for p in probes),
        "probes": [asdict(p) for p in probes],
        "verdicts": [asdict(v) for v in verdicts],
    }
    with open(run_dir / PREFLIGHT, "a") as f:
        f.write(json.dumps(line, sort_keys=True) + "\n")
