"""PNG plots of a study (matplotlib, no display needed). Each function writes one file."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from .analyze import Analysis, Series  # noqa: E402
from .metrics import allreduce_bandwidths  # noqa: E402


def _save(fig: plt.Figure, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _label(a: Analysis, s: Series, what: str) -> str:
    return f"{s.label}: {what}" if a.compares else what


def throughput(a: Analysis, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6, 4))
    for i, s in enumerate(a.series):
        color, ns = f"C{i}", [p.n for p in s.points]
        ax.errorbar(
            ns,
            [p.throughput for p in s.points],
            yerr=[0 if math.isnan(p.throughput_ci95) else p.throughput_ci95 for p in s.points],
            marker="o",
            capsize=4,
            color=color,
            label=_label(a, s, "measured (95% CI)"),
        )
        base = s.points[0]
        ax.plot(
            ns,
            [base.throughput * n / base.n for n in ns],
            "--",
            color=color if a.compares else "grey",
            alpha=0.6,
            label=_label(a, s, "ideal (linear)"),
        )
        if s.predictions:
            ax.plot(
                [q["n"] for q in s.predictions],
                [q["throughput"] for q in s.predictions],
                "x:",
                color=color,
                label=_label(a, s, "α–β model prediction"),
            )
    ax.set(xlabel="ranks", ylabel="samples / s", title=f"{a.kind} scaling: throughput")
    ax.set_xscale("log", base=2)
    ax.legend(fontsize=8)
    return _save(fig, path)


def efficiency(a: Analysis, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6, 4))
    for i, s in enumerate(a.series):
        ax.plot(
            [p.n for p in s.points],
            [100 * p.efficiency for p in s.points],
            "o-",
            color=f"C{i}",
            label=_label(a, s, "measured"),
        )
        if s.predictions:
            ax.plot(
                [q["n"] for q in s.predictions],
                [100 * q["efficiency"] for q in s.predictions],
                "x:",
                color=f"C{i}",
                label=_label(a, s, "α–β model prediction"),
            )
    ax.axhline(100, ls="--", color="grey")
    ax.set(xlabel="ranks", ylabel="efficiency (%)", title=f"{a.kind} scaling efficiency", ylim=(0, 110))
    ax.set_xscale("log", base=2)
    ax.legend(fontsize=8)
    return _save(fig, path)


def breakdown(a: Analysis, path: Path) -> Path:
    """Stacked bars per scale; with several series, their bars side by side at each scale."""
    fig, ax = plt.subplots(figsize=(max(6, 0.8 * len(a.points)), 4))
    bars = sorted(
        ((p.n, i, s.label, p) for i, s in enumerate(a.series) for p in s.points), key=lambda b: b[:2]
    )
    labels = [f"{n}\n{label}" if a.compares else str(n) for n, _, label, _ in bars]
    compute = [1e3 * p.compute_s for *_, p in bars]
    comm = [1e3 * p.comm_s for *_, p in bars]
    data = [1e3 * p.data_s for *_, p in bars]
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
        torch_rows = [r for r in rows if math.isfinite(r.get("torch_s", math.nan))]  # NaN in older records
        if torch_rows:
            ax.plot(
                [r["bytes"] for r in torch_rows],
                [allreduce_bandwidths(r["bytes"], r["torch_s"], n)[1] / 1e9 for r in torch_rows],
                "^-.",
                label=f"torch.distributed, {n} ranks",
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
