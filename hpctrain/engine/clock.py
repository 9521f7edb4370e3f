"""One clock for every engine, trainer and pipeline: marks on the timeline where the rank's work
runs, read once per step after the step ends.

On CPUs the work is synchronous, so a mark is the host's perf_counter. On CUDA, kernels and NCCL
collectives are queued and return at once: a host clock around them measures the queueing. A
mark there is a CUDA event recorded on the current (compute) stream, so it completes when the
device reaches it, after the work queued before it; the span between two marks is device time
(torch.cuda.Event.elapsed_time). Waits show up where they happen: a stream made to wait for NCCL
(DDP's backward, a pipeline's p2p wait) stalls between the marks around it, and a host that blocks
(Horovod's synchronize) records its next mark only once it returns, so the device's idle time
before that mark is the exposed wait.

A step takes its marks as it goes and calls `settle(last)` once at its end: the only place the
host waits for the device. Spans are read after that.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from typing import Any, Protocol

import torch

Mark = Any  # a float (HostClock) or a recorded torch.cuda.Event (CudaClock)


class Clock(ABC):
    @abstractmethod
    def mark(self) -> Mark:
        """A point on the timeline of this rank's work, here."""

    @abstractmethod
    def seconds(self, start: Mark, end: Mark) -> float:
        """Seconds from `start` to `end` (both reached: after settle of a mark at or after them)."""

    @abstractmethod
    def settle(self, last: Mark) -> float:
        """Wait until the work reaches `last`; the host's perf_counter then (for host-side waits
        such as the next step's data; on the host clock, `last` itself)."""


class HostClock(Clock):
    """Synchronous devices: the host's clock is the device's."""

    def mark(self) -> float:
        return time.perf_counter()

    def seconds(self, start: Mark, end: Mark) -> float:
        return float(end - start)

    def settle(self, last: Mark) -> float:
        return float(last)  # the mark is the host's time: the parts of a step add up to it exactly


class CudaClock(Clock):
    """CUDA events on the current stream of the bound device."""

    def mark(self) -> torch.cuda.Event:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def seconds(self, start: Mark, end: Mark) -> float:
        return float(start.elapsed_time(end)) / 1e3  # elapsed_time is in milliseconds

    def settle(self, last: Mark) -> float:
        last.synchronize()
        return time.perf_counter()


class Stamped(Protocol):
    """What an engine's hooks keep: the mark where the latest gradients' computation ended (DDP's
    buckets, FSDP's units), taken by wait_gradients; None when none ended this step."""

    ready: Mark | None

    def take(self) -> Mark | None:
        """The latest mark, once."""


def clock_for(device: torch.device) -> Clock:
    return CudaClock() if device.type == "cuda" else HostClock()
