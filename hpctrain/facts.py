"""What this host can do, gathered in one place and passed explicitly to pure planning code."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass


@dataclass(frozen=True)
class HostFacts:
    cpu_count: int
    is_root: bool
    hostname: str
    cuda_available: bool
    cuda_bf16: bool
    cpu_fp16_autocast: bool
    cpu_bf16_autocast: bool

    @classmethod
    def gather(cls) -> HostFacts:
        import torch

        cuda = torch.cuda.is_available()
        return cls(
            cpu_count=len(os.sched_getaffinity(0))
            if hasattr(os, "sched_getaffinity")
            else (os.cpu_count() or 1),
            is_root=os.geteuid() == 0,
            hostname=socket.gethostname(),
            cuda_available=cuda,
            cuda_bf16=cuda and torch.cuda.is_bf16_supported(),
            cpu_fp16_autocast=autocast_supported("fp16", "cpu"),
            cpu_bf16_autocast=autocast_supported("bf16", "cpu"),
        )

    @classmethod
    def example(cls, **changes: object) -> HostFacts:
        """A fixed 2-core CPU host, for tests and snapshots."""
        base = dict(
            cpu_count=2,
            is_root=False,
            hostname="host0",
            cuda_available=False,
            cuda_bf16=False,
            cpu_fp16_autocast=True,
            cpu_bf16_autocast=True,
        )
        base.update(changes)
        return cls(**base)  # type: ignore[arg-type]


def mpi_library_version() -> str:
    """The MPI library's own version line (mpi4py returns it NUL-terminated)."""
    from mpi4py import MPI

    return MPI.Get_library_version().replace("\x00", "").strip().splitlines()[0]


def free_tcp_port() -> int:
    """A TCP port free on this host now (the kernel's choice), e.g. for torch.distributed's store."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wants_cuda(choice: str) -> bool:
    """train.device: cuda, or auto on a machine where torch sees a GPU."""
    import torch

    return choice == "cuda" or (choice == "auto" and torch.cuda.is_available())


def autocast_supported(precision: str, device_type: str) -> bool:
    """Whether this torch build can autocast to `precision` on `device_type` (probed, not assumed)."""
    import torch

    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(precision)
    if dtype is None:
        return True
    try:
        with torch.autocast(device_type=device_type, dtype=dtype):
            a = torch.ones(2, 2, device=device_type)
            return (a @ a).dtype == dtype
    except (RuntimeError, AssertionError):
        return False
