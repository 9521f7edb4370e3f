"""The model's FLOPs, counted once per run, and the peak its MFU is taken against
(analysis/peak.py says how MFU is defined and where peaks come from).

FLOPs are counted by torch's FlopCounterMode over one forward and backward pass of the model built
on the meta device: no memory, no compute and no communication, whatever the engine and the
parallelism, and user models (model._target_) are counted the same way as the built-in ones.
"""

from __future__ import annotations

import hashlib
import math
import platform
import socket
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

from hpctrain import __version__
from hpctrain.analysis.peak import Peak, table_peak
from hpctrain.config.schema import Config
from hpctrain.facts import cache_dir, keep_cached, read_cached
from hpctrain.train.parts import make_model, make_objective, workload_label

PROBE_N = 512  # the CPU probe's square GEMM: 2 n^3 FLOPs a call, large enough to reach the BLAS peak


def flops_per_sample(cfg: Config, dataset: Any, batch: int, fresh: bool = False) -> tuple[float, str]:
    """(training FLOPs of one sample, forward + backward; NaN where it cannot be counted, with the
    reason) on `batch` samples like the dataset's first. Never raises: the count runs after
    training, and a model it cannot count must not cost the run its summary. Built-in models are
    counted once per configuration and then read from the cache (flops_cache); `fresh`: counted
    again, whatever the cache says (it said something implausible: rank.py)."""
    try:
        x0, y0 = (torch.as_tensor(v) for v in dataset[0])
        path = flops_cache(cfg, x0, y0, batch)
        cached = None if fresh else _read_count(path)
        if cached is not None:
            return cached, "FlopCounterMode (cached)"
        with torch.device("meta"):
            model = make_model(cfg)
        x = x0.unsqueeze(0).expand(batch, *x0.shape).to("meta")
        y = y0.unsqueeze(0).expand(batch, *y0.shape).to("meta")
        with FlopCounterMode(display=False) as counter:
            make_objective(cfg)(model, x, y).backward()
    except Exception as e:  # noqa: BLE001 - a model that cannot live on the meta device is not counted
        return float("nan"), f"not counted: {type(e).__name__}: {str(e)[:200]}"
    flops = counter.get_total_flops() / batch
    if path is not None:
        keep_cached(path, {"flops_per_sample": flops})
    return flops, "FlopCounterMode"


def flops_cache(cfg: Config, x0: torch.Tensor, y0: torch.Tensor, batch: int) -> Path | None:
    """Where the count of this configuration is kept; None for user code (model, loss or data
    `_target_`s), whose source may change under the same settings. Counting imports
    torch._dynamo (every TorchDispatchMode's dispatch is wrapped by torch._disable_dynamo): about
    1.5 CPU-seconds a run on this machine, where a Horovod rank would otherwise never import it."""
    if workload_label(cfg):
        return None
    key = repr(
        (
            __version__,
            torch.__version__,
            cfg.model,
            cfg.data,
            cfg.loss,
            (tuple(x0.shape), str(x0.dtype), tuple(y0.shape), str(y0.dtype)),
            batch,
        )
    )
    return cache_dir() / "flops" / f"{hashlib.sha256(key.encode()).hexdigest()[:24]}.json"


def _read_count(path: Path | None) -> float | None:
    """The cached count; None when absent or damaged (counted again)."""
    return _positive(read_cached(path), "flops_per_sample") if path is not None else None


def _positive(doc: object, key: str) -> float | None:
    """A positive, finite figure of a cache entry under `key`; None when absent or damaged."""
    found = doc.get(key) if isinstance(doc, dict) else None
    return float(found) if isinstance(found, (int, float)) and math.isfinite(found) and found > 0 else None


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


def device_peak(cfg: Config, device: torch.device, fresh: bool = False) -> Peak:
    """The peak of one of this run's devices at its precision: config, else the table, else (CPU)
    the GEMM probe (cached per host; `fresh`: probed again); NaN for a GPU the table does not know."""
    precision = str(cfg.precision.name)
    if cfg.cluster.peak_tflops is not None:
        return Peak(cfg.cluster.peak_tflops, "config: cluster.peak_tflops")
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        return table_peak(name, precision) or Peak(
            math.nan, f"unknown device {name}: set cluster.peak_tflops"
        )
    threads = torch.get_num_threads()
    what = f"probe: {PROBE_N}x{PROBE_N} {precision} GEMM on {threads} thread(s)"
    path = peak_cache(precision, threads)
    doc = None if fresh else read_cached(path)  # read once: the figure and how old it is
    found = _positive(doc, "tflops")
    if found is not None:
        return Peak(found, f"{what}, cached{_age(doc)}")
    probe = gemm_probe_tflops(precision)
    keep_cached(path, {"tflops": probe, "probed": time.time()})
    return Peak(probe, what)


def _age(doc: object) -> str:
    """How long ago a cached probe ran (' 3 h ago'), from its record; '' where it says nothing."""
    when = doc.get("probed") if isinstance(doc, dict) else None
    if not isinstance(when, (int, float)) or not math.isfinite(when):
        return ""
    hours = max(0.0, time.time() - when) / 3600
    return f" {hours:.0f} h ago" if hours >= 1 else f" {60 * hours:.0f} min ago"


def peak_cache(precision: str, threads: int) -> Path:
    """Where this host's probed peak is kept: one probe per host, CPU, thread count, precision and
    torch, so every run's MFU on a node is against the same peak (a probe per run varied with the
    load beside it) and a run's end skips 0.2 s of GEMMs. Delete the file to probe again."""
    key = repr((socket.gethostname(), _cpu_model(), threads, precision, torch.__version__, PROBE_N))
    return cache_dir() / "peak" / f"{hashlib.sha256(key.encode()).hexdigest()[:24]}.json"


def _cpu_model() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return platform.processor()
    names = [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")]
    return f"{names[0] if names else platform.processor()} x{len(names)}"
