"""Model FLOPs utilisation (MFU): the model's FLOPs per second that a run achieved, as a share of
what its devices could do at peak (Chowdhery et al. 2022, PaLM, appendix B; as TorchTitan and
Megatron report it: training FLOPs of the model, not counting recomputation).

The peak comes from, in order: the config (cluster.peak_tflops), a short table of known devices
by name and precision (dense, no sparsity: the vendors' datasheets), or on CPUs a GEMM probe timed
on the rank (train/flops.py), which is what the CPU achieves, not a datasheet figure.
"""

from __future__ import annotations

from dataclasses import dataclass

# dense tensor-core TFLOP/s per device: (bf16/fp16, fp32 matmuls as torch runs them by default:
# full fp32 unless torch.backends.cuda.matmul.allow_tf32). Sources: NVIDIA H100 datasheet (SXM5:
# 989.4 bf16, 66.9 fp32; PCIe: 756.5, 51.2), H200 datasheet (as H100 SXM), A100 datasheet (312,
# 19.5), V100 datasheet (SXM2: 125 fp16, 15.7 fp32), L40S datasheet (362.05, 91.6).
KNOWN_PEAKS: dict[str, tuple[float, float]] = {
    "H200": (989.4, 66.9),
    "H100 SXM": (989.4, 66.9),
    "H100 80GB HBM3": (989.4, 66.9),  # how torch names the SXM part
    "H100 PCIe": (756.5, 51.2),
    "H100": (756.5, 51.2),  # an unnamed H100: the lower (PCIe) figure, so MFU is not understated
    "A100": (312.0, 19.5),
    "L40S": (362.05, 91.6),
    "V100": (125.0, 15.7),
}


@dataclass(frozen=True)
class Peak:
    tflops: float  # per device, at the run's precision
    source: str  # "config", "table: <device>", "probe: <what>"


def table_peak(device_name: str, precision: str) -> Peak | None:
    """The table's peak for a device named as torch names it (torch.cuda.get_device_name), the
    longest matching entry first; None for a device it does not know."""
    for key in sorted(KNOWN_PEAKS, key=len, reverse=True):
        if key.lower() in device_name.lower():
            low, fp32 = KNOWN_PEAKS[key]
            return Peak(low if precision in ("bf16", "fp16") else fp32, f"table: {key} {precision} dense")
    return None


def achieved_tflops(flops_per_sample: float, samples_per_s: float, world: int) -> float:
    """The model's FLOP/s per rank, in TFLOP/s: every rank's share of the global work."""
    return flops_per_sample * samples_per_s / max(world, 1) / 1e12


def mfu(flops_per_sample: float, samples_per_s: float, world: int, peak_tflops: float) -> float:
    """Achieved over peak, both per rank (NaN where either is unknown)."""
    if not peak_tflops > 0 or not flops_per_sample > 0:
        return float("nan")
    return achieved_tflops(flops_per_sample, samples_per_s, world) / peak_tflops
