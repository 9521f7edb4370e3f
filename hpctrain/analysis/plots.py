"""PNG plots of a study (matplotlib, no display needed). Each function writes one file."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from .analyze import Analysis  # noqa: E402
from .metrics import allreduce_bandwidths  # noqa: E402


def _save(fig: plt.Figure, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def throughput(a: Analysis, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6, 4))
    ns = [p.n for p in a.points]
    ax.errorbar(
        ns,
        [p.throughput for p in a.points],
        yerr=[0 if p.throughput_ci95 != p.throughput_ci95 else p.throughput_ci95 for p in a.points],
        marker="o",
        capsize=4,
        label="measured (95% CI)",
    )
    base = a.points[0]
    ax.plot(ns, [base.throughput * n / base.n for n in ns], "--", color="grey", label="ideal (linear)")
    if a.predictions:
        ax.plot(
            [q["n"] for q in a.predictions],
            [q["throughput"] for q in a.predictions],
            "x:",
            label="α–β model prediction",
        )
    ax.set(xlabel="ranks", ylabel="samples / s", title=f"{a.kind} scaling: throughput")
    ax.set_xscale("log", base=2)
    ax.legend()
    return _save(fig, path)


def efficiency(a: Analysis, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([p.n for p in a.points], [100 * p.efficiency for p in a.points], "o-", label="measured")
    if a.predictions:
        ax.plot(
            [q["n"] for q in a.predictions],
            [100 * q["efficiency"] for q in a.predictions],
            "x:",
            label="α–β model prediction",
        )
    ax.axhline(100, ls="--", color="grey")
    ax.set(xlabel="ranks", ylabel="efficiency (%)", title=f"{a.kind} scaling efficiency", ylim=(0, 110))
    ax.set_xscale("log", base=2)
    ax.legend()
    return _save(fig, path)


def breakdown(a: Analysis, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6, 4))
    labels = [str(p.n) for p in a.points]
    compute = [1e3 * p.compute_s for p in a.points]
    comm = [1e3 * p.comm_s for p in a.points]
    data = [1e3 * p.data_s for p in a.points]
    ax.bar(labels, compute, label="compute")
    ax.bar(labels, comm, bottom=compute, label="exposed communication")
    ax.bar(labels, data, bottom=[c + m for c, m in zip(compute, comm)], label="data wait")
    ax.set(xlabel="ranks", ylabel="ms per step", title="where a step's time goes")
    ax.legend()
    return _save(fig, path)


def bus_bandwidth(a: Analysis, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6, 4))
    for n in sorted({r["n"] for r in a.allreduce}):
        rows = sorted((r for r in a.allreduce if r["n"] == n), key=lambda r: r["bytes"])
        sizes = [r["bytes"] for r in rows]
        ax.plot(
            sizes,
            [allreduce_bandwidths(r["bytes"], r["hvd_s"], n)[1] / 1e9 for r in rows],
            "o-",
            label=f"Horovod, {n} ranks",
        )
        ax.plot(
            sizes,
            [allreduce_bandwidths(r["bytes"], r["mpi_s"], n)[1] / 1e9 for r in rows],
            "s--",
            label=f"MPI, {n} ranks",
        )
    if a.allreduce:
        ax.set_xscale("log", base=2)
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no allreduce benchmark in this study", ha="center", transform=ax.transAxes)
    ax.set(xlabel="message size (bytes)", ylabel="bus bandwidth (GB/s)", title="allreduce bus bandwidth")
    return _save(fig, path)


PLOTS = {
    "throughput.png": throughput,
    "efficiency.png": efficiency,
    "breakdown.png": breakdown,
    "busbw.png": bus_bandwidth,
}


def write_plots(a: Analysis, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    return [fn(a, out / name) for name, fn in PLOTS.items()]
