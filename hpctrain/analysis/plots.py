"""PNG plots of a study (matplotlib, no display needed). Each function writes one file."""

from __future__ import annotations

import hashlib
import math
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib import ticker  # noqa: E402

from hpctrain.analysis.analyze import Analysis, Series, interval_note
from hpctrain.analysis.metrics import allreduce_bandwidths
from hpctrain.analysis.uncertainty import Interval

# drawn at the dpi it is saved at: the layout's text measurements are then the saved image's
# (matplotlib caches them per renderer), instead of being measured again (7% of a report)
DPI = 110


def _save(fig: plt.Figure, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi="figure")
    plt.close(fig)
    return path


def _log(ax: Any, which: str, base: float, unit: str = "") -> None:
    """A log axis labelled in plain numbers (ranks 1 2 4 8; bytes in KiB/MiB), not matplotlib's
    default mathtext powers (10^2), which are harder to read and 0.2 s per plot to typeset."""
    getattr(ax, f"set_{which}scale")("log", base=base)
    axis = ax.xaxis if which == "x" else ax.yaxis
    if unit == "B":
        axis.set_major_locator(ticker.FixedLocator(_byte_ticks(*getattr(ax.dataLim, f"interval{which}"))))
        axis.set_minor_locator(ticker.NullLocator())
        axis.set_major_formatter(ticker.FuncFormatter(lambda v, _: _bytes(v)))
    else:
        axis.set_major_formatter(ticker.LogFormatter(base))
        axis.set_minor_formatter(ticker.LogFormatter(base, labelOnlyBase=False, minor_thresholds=(2, 0.5)))


def _byte_ticks(lo: float, hi: float, most: int = 6) -> list[float]:
    """Powers of two from `lo` to `hi`, every second or fourth one where all would crowd the axis:
    at most `most` labels ("128 KiB" is 7 characters; eleven of them ran into each other)."""
    first, last = math.ceil(math.log2(max(lo, 1.0))), math.floor(math.log2(max(hi, 1.0)))
    step = max(1, math.ceil((last - first + 1) / most))
    return [2.0**e for e in range(first, last + 1, step)]


def _bytes(v: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if v >= size:
            return f"{v / size:g} {unit}"
    return f"{v:g} B"


def _label(a: Analysis, s: Series, what: str) -> str:
    return f"{s.label}: {what}" if a.compares else what


def _span(s: Series) -> list[int]:
    """Every scale the series shows, measured and predicted: the ideal line spans them all."""
    return sorted({p.n for p in s.points} | {q.n for q in s.predictions})


def _intervals(ax: Any, ns: list[int], intervals: list[Interval], color: str) -> None:
    """Each point's interval as a capped vertical bar from lo to hi. Drawn as it is, not as an
    offset from the point: a mean need not lie inside the t interval of the log mean."""
    known = [(n, i) for n, i in zip(ns, intervals) if i.known and math.isfinite(i.lo + i.hi)]
    if not known:
        return
    xs, los, his = [n for n, _ in known], [i.lo for _, i in known], [i.hi for _, i in known]
    ax.vlines(xs, los, his, color=color)
    ax.plot(xs + xs, los + his, "_", color=color, markersize=8)


def throughput(a: Analysis, path: Path) -> Path:
    fig, ax = plt.subplots(dpi=DPI, figsize=(6, 4))
    for i, s in enumerate(a.series):
        color, ns = f"C{i}", [p.n for p in s.points]
        values = [p.throughput for p in s.points]
        ax.plot(
            ns,
            values,
            "o-",
            color=color,
            label=_label(a, s, "measured (" + interval_note(a).removeprefix("ranges: ") + ")"),
        )
        _intervals(ax, ns, [p.throughput_ci for p in s.points], color)
        base = s.points[0]
        ax.plot(
            _span(s),
            [base.throughput * n / base.n for n in _span(s)],
            "--",
            color=color if a.compares else "grey",
            alpha=0.6,
            label=_label(a, s, "ideal (linear)"),
        )
        _predicted(
            ax, s, color, [q.throughput for q in s.predictions], [q.throughput_range() for q in s.predictions]
        )
    ax.set(xlabel="ranks", ylabel="samples / s", title=f"{a.kind} scaling: throughput")
    _log(ax, "x", 2)
    _log(ax, "y", 10)  # the ideal line grows N-fold; a linear axis would flatten the measurements
    ax.legend(fontsize=8)
    return _save(fig, path)


def _predicted(
    ax: Any, s: Series, color: str, values: list[float], ranges: list[tuple[float, float]]
) -> None:
    """The model's predictions as a line, with their band when leave-one-out could check them."""
    if not s.predictions:
        return
    ns = [q.n for q in s.predictions]
    ax.plot(ns, values, "x:", color=color, label=f"{s.label}: model prediction")
    if all(math.isfinite(q.band) for q in s.predictions):
        ax.fill_between(
            ns,
            [r[0] for r in ranges],
            [r[1] for r in ranges],
            color=color,
            alpha=0.15,
            label=f"{s.label}: ± largest leave-one-out error",
        )


def efficiency(a: Analysis, path: Path) -> Path:
    fig, ax = plt.subplots(dpi=DPI, figsize=(6, 4))
    for i, s in enumerate(a.series):
        ns = [p.n for p in s.points]
        ax.plot(
            ns, [100 * p.efficiency for p in s.points], "o-", color=f"C{i}", label=_label(a, s, "measured")
        )
        _intervals(ax, ns, [p.efficiency_ci.scaled(100) for p in s.points], f"C{i}")
        _predicted(
            ax,
            s,
            f"C{i}",
            [100 * q.efficiency for q in s.predictions],
            [(100 * q.efficiency / (1 + q.band), 100 * q.efficiency * (1 + q.band)) for q in s.predictions],
        )
    ax.axhline(100, ls="--", color="grey", label="ideal")
    ax.set(xlabel="ranks", ylabel="efficiency (%)", title=f"{a.kind} scaling efficiency", ylim=(0, 110))
    _log(ax, "x", 2)
    ax.legend(fontsize=8)
    return _save(fig, path)


def mfu(a: Analysis, path: Path) -> Path:
    """Model FLOPs utilisation per scale, and the step model's at the predicted scales."""
    fig, ax = plt.subplots(dpi=DPI, figsize=(6, 4))
    for i, s in enumerate(a.series):  # drawn only where a point has an MFU (SHOWS)
        known = [p for p in s.points if math.isfinite(p.mfu)]
        if not known:
            continue
        ax.plot(
            [p.n for p in known],
            [100 * p.mfu for p in known],
            "o-",
            color=f"C{i}",
            label=_label(a, s, "measured"),
        )
        if all(math.isfinite(q.mfu) for q in s.predictions):
            _predicted(
                ax,
                s,
                f"C{i}",
                [100 * q.mfu for q in s.predictions],
                [(100 * q.mfu / (1 + q.band), 100 * q.mfu * (1 + q.band)) for q in s.predictions],
            )
    _log(ax, "x", 2)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    ax.set(xlabel="ranks", ylabel="MFU (%)", title=f"{a.kind} scaling: model FLOPs utilisation")
    return _save(fig, path)


def breakdown(a: Analysis, path: Path) -> Path:
    """Stacked bars per scale; with several series, their bars side by side at each scale."""
    fig, ax = plt.subplots(dpi=DPI, figsize=(max(6, 0.8 * len(a.points)), 4))
    bars = sorted(
        ((p.n, i, s.label, p) for i, s in enumerate(a.series) for p in s.points), key=lambda b: b[:2]
    )
    labels = [f"{n}\n{label}" if a.compares else str(n) for n, _, label, _ in bars]
    wait = [1e3 * p.imbalance_s if math.isfinite(p.imbalance_s) else 0.0 for *_, p in bars]
    parts = {
        "compute": [1e3 * p.compute_s for *_, p in bars],
        "exposed communication": [max(1e3 * p.comm_s - w, 0.0) for (*_, p), w in zip(bars, wait)],
        "waiting for the slowest rank": wait,
        "data wait": [1e3 * p.data_s for *_, p in bars],
    }
    for key, view in a.parts.items():  # each part's of the step (analysis/study_parts.py)
        for label, figure in view.bars:
            parts[label] = [1e3 * p.parts.get(key, {}).get(figure, 0.0) for *_, p in bars]
    bottom = [0.0] * len(bars)
    for name, values in parts.items():
        if any(values) or name in ("compute", "exposed communication"):
            ax.bar(labels, values, bottom=bottom, label=name)
            bottom = [b + v for b, v in zip(bottom, values)]
    ax.set(xlabel="ranks", ylabel="ms per step", title="where a step's time goes")
    ax.legend()
    return _save(fig, path)


def bus_bandwidth(a: Analysis, path: Path) -> Path:
    """Each library's bus bandwidth against message size (drawn only with a benchmark: SHOWS)."""
    fig, ax = plt.subplots(dpi=DPI, figsize=(6, 4))
    for n in sorted({r.n for r in a.allreduce}):
        rows = sorted((r for r in a.allreduce if r.n == n), key=lambda r: r.bytes)
        sizes = [r.bytes for r in rows]
        ax.plot(
            sizes,
            [allreduce_bandwidths(r.bytes, r.hvd_s, n)[1] / 1e9 for r in rows],
            "o-",
            label=f"Horovod, {n} ranks",
        )
        ax.plot(
            sizes,
            [allreduce_bandwidths(r.bytes, r.mpi_s, n)[1] / 1e9 for r in rows],
            "s--",
            label=f"MPI, {n} ranks",
        )
        torch_rows = [r for r in rows if math.isfinite(r.torch_s)]  # NaN in older records
        if torch_rows:
            ax.plot(
                [r.bytes for r in torch_rows],
                [allreduce_bandwidths(r.bytes, r.torch_s, n)[1] / 1e9 for r in torch_rows],
                "^-.",
                label=f"torch.distributed, {n} ranks",
            )
    _log(ax, "x", 2, "B")
    ax.legend(fontsize=8)
    ax.set(xlabel="message size", ylabel="bus bandwidth (GB/s)", title="allreduce bus bandwidth")
    return _save(fig, path)


def roofline(a: Analysis, path: Path) -> Path:
    """Time against bytes: each engine's allreduce model at each world size (lines), the
    benchmark's timings (dots), and each run's gradients: expected (circle) and exposed (cross)."""
    fig, ax = plt.subplots(dpi=DPI, figsize=(6, 4))
    drawn = False
    for i, s in enumerate(a.series):
        if s.comm is None:
            continue
        column = s.collective
        for n in sorted({r.n for r in a.allreduce if r.n > 1}):
            rows = sorted(
                (r for r in a.allreduce if r.n == n and math.isfinite(getattr(r, column, math.nan))),
                key=lambda r: r.bytes,
            )
            if not rows:
                continue
            sizes = [r.bytes for r in rows]
            ax.plot(sizes, [1e3 * getattr(r, column) for r in rows], ".", color=f"C{i}", alpha=0.5)
            ax.plot(
                sizes,
                [1e3 * s.comm.allreduce_s(n, b) for b in sizes],
                "-",
                color=f"C{i}",
                alpha=0.6,
                label=f"{s.label}: model, {n} ranks",
            )
            drawn = True
        for p in s.points:
            if p.roofline is not None:
                r = p.roofline
                ax.plot([r.grad_bytes], [1e3 * r.expected_s], "o", color=f"C{i}", mfc="none")
                ax.plot([r.grad_bytes], [1e3 * max(r.exposed_s, 1e-6)], "x", color=f"C{i}")
                if r.wait_s > 0:
                    ax.plot([r.grad_bytes], [1e3 * (r.exposed_s + r.wait_s)], "+", color=f"C{i}", ms=10)
                ax.annotate(f"N={p.n}", (r.grad_bytes, 1e3 * r.expected_s), fontsize=7)
    if drawn:
        _log(ax, "x", 2, "B")
        _log(ax, "y", 10)
        ax.plot([], [], "ko", mfc="none", label="a run's gradients: expected")
        ax.plot([], [], "kx", label="a run's gradients: exposed (measured)")
        if any(p.roofline and p.roofline.wait_s > 0 for p in a.points):
            ax.plot([], [], "k+", ms=10, label="… plus waiting for the slowest rank")
        ax.legend(fontsize=7)
    else:
        ax.text(0.5, 0.5, "no allreduce benchmark in this study", ha="center", transform=ax.transAxes)
    ax.set(xlabel="bytes reduced", ylabel="ms", title="communication roofline")
    return _save(fig, path)


PLOTS = {
    "throughput.png": throughput,
    "efficiency.png": efficiency,
    "mfu.png": mfu,
    "breakdown.png": breakdown,
    "busbw.png": bus_bandwidth,
    "roofline.png": roofline,
}


def _any_mfu(a: Analysis) -> bool:
    return any(math.isfinite(p.mfu) for p in a.points)


def _any_roofline(a: Analysis) -> bool:
    return any(s.comm is not None for s in a.series) and any(r.n > 1 for r in a.allreduce)


# what a plot needs to show anything; a plot without it is left out of the report, not drawn as
# an empty frame
SHOWS: dict[str, Callable[[Analysis], bool]] = {
    "mfu.png": _any_mfu,
    "busbw.png": lambda a: bool(a.allreduce),
    "roofline.png": _any_roofline,
}


def shown_plots(a: Analysis) -> list[str]:
    """The plots of PLOTS this analysis has something to show in."""
    return [name for name in PLOTS if SHOWS.get(name, lambda _: True)(a)]


DIGEST = ".plots.sha256"  # beside the plots: what they were drawn from


def write_plots(a: Analysis, out: Path) -> list[Path]:
    """Every plot of the analysis, drawn again only when what they show changed: a re-analysis
    of a study whose records did not change (a `study resume` that found nothing to run, a second
    `hpctrain analyze`) keeps the plots drawn from the same analysis by the same code. Drawing is
    most of a report's time (`hpctrain bench analyze`)."""
    out.mkdir(parents=True, exist_ok=True)
    names = shown_plots(a)
    for name in set(PLOTS) - set(names):  # drawn by an earlier analysis that had something to show
        (out / name).unlink(missing_ok=True)
    paths = [out / name for name in names]
    digest = hashlib.sha256(repr(a).encode() + Path(__file__).read_bytes()).hexdigest()
    mark = out / DIGEST
    try:
        same = mark.read_text() == digest and all(p.is_file() for p in paths)
    except OSError:
        same = False
    if same:
        return paths
    mark.unlink(missing_ok=True)  # never a digest beside plots half redrawn
    draw_all(a, [(out / name, PLOTS[name]) for name in names])
    mark.write_text(digest)
    return paths


Plot = Callable[[Analysis, Path], Path]


def draw_all(a: Analysis, plots: list[tuple[Path, Plot]]) -> None:
    """Every plot, every other one in a forked child where that is safe and helps: a second core,
    and this process running one thread (a fork copies only the calling thread: another's locks
    would stay taken in the child). Drawing is CPU-bound Python that holds the GIL, so threads
    would not help; the child inherits matplotlib already imported, and draws from the analysis in
    memory. Whatever the child did not finish (it failed, or was killed) is drawn here again.
    `hpctrain bench analyze`, 1,000 runs on 2 cores: the report 0.88 s -> see the benchmark page."""
    theirs, mine = plots[::2], plots[1::2]
    if len(os.sched_getaffinity(0)) < 2 or threading.active_count() > 1 or not mine:
        theirs, mine = [], plots
    pid = os.fork() if theirs else 0
    if theirs and pid == 0:  # the child: draw, then leave at once (no exit handlers, no flushing)
        code = 1
        try:
            for path, fn in theirs:
                fn(a, path)
            code = 0
        finally:
            os._exit(code)
    try:
        for path, fn in mine:
            fn(a, path)
    finally:
        done = not theirs or os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    if not done:
        for path, fn in theirs:
            fn(a, path)
