"""The run's own allreduce curve, two points of it: one value (all latency) and the gradients'
size (latency + bandwidth), timed after training with the engine's collective, at the run's world
size and compression. The communication roofline places the step's exposed time against it."""

from __future__ import annotations

import statistics
import time
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from hpctrain.engine.base import Engine

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def probe_allreduce(
    engine: Engine, numel: int, device: torch.device, compression: str, repeats: int = 5
) -> tuple[float, float]:
    """(median seconds for one value, for `numel` values); every rank calls it with the same
    arguments. A barrier before each timing keeps one rank's late arrival out of the figure."""
    dtype = DTYPES.get(compression, torch.float32)
    out = []
    for size in (1, numel):
        buf = torch.zeros(size, dtype=dtype, device=device)
        times = []
        for i in range(repeats + 1):  # the first is a warm-up (buffers, negotiation caches)
            engine.barrier(f"hpctrain.probe.barrier.{size}.{i}")
            t0 = time.perf_counter()
            engine.allreduce_now(buf, f"hpctrain.probe.{size}.{i}")
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            times.append(time.perf_counter() - t0)
        out.append(statistics.median(times[1:]))
    return out[0], out[1]
