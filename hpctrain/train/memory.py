"""Peak memory of the training itself: reset after setup, read at the end. On GPUs the caching
allocator's high-water mark; on CPUs the process's peak resident set (VmHWM), which Linux resets
when "5" is written to /proc/self/clear_refs (proc(5)), so model construction and tracing (a
pipeline traces the whole model on every rank) do not count. Without that file (other kernels),
the process's lifetime peak (getrusage) is reported."""

from __future__ import annotations

import resource
from pathlib import Path

import torch

CLEAR_REFS = Path("/proc/self/clear_refs")
STATUS = Path("/proc/self/status")


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    try:
        CLEAR_REFS.write_text("5")
    except OSError:
        pass  # the lifetime peak is reported instead


def peak_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    try:
        for line in STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
