"""Peak memory of the training itself: reset after setup, read at the end. On GPUs the caching
allocator's high-water mark; on CPUs the process's peak resident set (VmHWM), which Linux resets
when "5" is written to /proc/self/clear_refs (proc(5)), so model construction and tracing (a
pipeline traces the whole model on every rank) do not count. Before the reset, glibc's free
memory is handed back (malloc_trim(3)): otherwise the step's tensors can reuse pages freed after
setup and never raise the peak. Without clear_refs (other kernels), the process's lifetime peak
(getrusage) is reported."""

from __future__ import annotations

import ctypes
import ctypes.util
import resource
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from torch import nn

CLEAR_REFS = Path("/proc/self/clear_refs")
STATUS = Path("/proc/self/status")


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        import torch

        torch.cuda.reset_peak_memory_stats(device)
        return
    _trim_free_memory()
    try:
        CLEAR_REFS.write_text("5")
    except OSError:
        pass  # the lifetime peak is reported instead


def _trim_free_memory() -> None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        if libc is not None and hasattr(libc, "malloc_trim"):
            libc.malloc_trim(0)
    except OSError:
        pass  # not glibc: the peak may include reused setup memory


def peak_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        import torch

        return int(torch.cuda.max_memory_allocated(device))
    return host_peak_bytes()


def host_peak_bytes() -> int:
    """The process's peak resident set (without torch: a user's script may never import it)."""
    try:
        for line in STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def local_bytes(t: Any) -> int:
    """The bytes of this rank's part of a tensor (a DTensor's local shard, else all of it); 0 for
    scalars (an optimizer's step count) and for what is not a tensor."""
    import torch

    t = t.to_local() if hasattr(t, "to_local") else t
    return int(t.numel() * t.element_size()) if isinstance(t, torch.Tensor) and t.dim() > 0 else 0


def held_bytes(model: nn.Module, optimizer: Any) -> dict[str, int]:
    """What this rank holds of the parameters, gradients and optimizer state: its shards for a
    sharded model (DTensors: the local part), everything for a replicated one."""
    params = list(model.parameters())
    return {
        "param_bytes": sum(local_bytes(p) for p in params),
        "grad_bytes": sum(local_bytes(p.grad) for p in params if p.grad is not None),
        "optimizer_bytes": sum(local_bytes(v) for s in optimizer.state.values() for v in s.values()),
    }
