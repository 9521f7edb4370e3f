"""The model's FLOPs, counted once per run, and the peak its MFU is taken against
(analysis/peak.py says how MFU is defined and where peaks come from).

FLOPs are counted by torch's FlopCounterMode over one forward and backward pass of the model built
on the meta device: no memory, no compute and no communication, whatever the engine and the
parallelism, and user models (model._target_) are counted the same way as the built-in ones.
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

from hpctrain.analysis.peak import Peak, table_peak
from hpctrain.config.schema import Config
from hpctrain.train.parts import make_criterion, make_model

PROBE_N = 512  # the CPU probe's square GEMM: 2 n^3 FLOPs a call, large enough to reach the BLAS peak


def flops_per_sample(cfg: Config, dataset: Any, batch: int) -> tuple[float, str]:
    """(training FLOPs of one sample, forward + backward; NaN where it cannot be counted, with the
    reason) on `batch` samples like the dataset's first. Never raises: the count runs after
    training, and a model it cannot count must not cost the run its summary."""
    try:
        x0, y0 = (torch.as_tensor(v) for v in dataset[0])
        with torch.device("meta"):
            model = make_model(cfg)
        x = x0.unsqueeze(0).expand(batch, *x0.shape).to("meta")
        y = y0.unsqueeze(0).expand(batch, *y0.shape).to("meta")
        with FlopCounterMode(display=False) as counter:
            make_criterion(cfg)(model(x), y).backward()
    except Exception as e:  # noqa: BLE001 - a model that cannot live on the meta device is not counted
        return float("nan"), f"not counted: {type(e).__name__}: {str(e)[:200]}"
    return counter.get_total_flops() / batch, "FlopCounterMode"


def gemm_probe_tflops(precision: str, n: int = PROBE_N, seconds: float = 0.2) -> float:
    """What this process's CPU threads achieve on a square GEMM at `precision`, in TFLOP/s."""
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    a @ b  # warm-up: BLAS threads, packing buffers
    calls, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds or calls < 3:
        a @ b
        calls += 1
    return 2 * n**3 * calls / elapsed / 1e12


def device_peak(cfg: Config, device: torch.device) -> Peak:
    """The peak of one of this run's devices at its precision: config, else the table, else (CPU)
    the GEMM probe; NaN for a GPU the table does not know."""
    precision = str(cfg.precision.name)
    if cfg.cluster.peak_tflops is not None:
        return Peak(cfg.cluster.peak_tflops, "config: cluster.peak_tflops")
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        return table_peak(name, precision) or Peak(
            math.nan, f"unknown device {name}: set cluster.peak_tflops"
        )
    threads = torch.get_num_threads()
    probe = gemm_probe_tflops(precision)
    return Peak(probe, f"probe: {PROBE_N}x{PROBE_N} {precision} GEMM on {threads} thread(s)")
