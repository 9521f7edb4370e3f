"""A study's report: terminal table, CSV, Markdown, and a self-contained HTML page."""

from __future__ import annotations

import base64
import csv
import html
import math
from pathlib import Path

from rich.table import Table

from .analyze import Analysis, Series
from .plots import write_plots

COLUMNS = (
    "series",
    "N",
    "reps",
    "samples/s",
    "±CI95",
    "speedup",
    "effic.",
    "comm",
    "data",
    "bubble",
    "bubble theory",
    "peak MiB",
    "K–F e",
    "step ms",
    "model ms",
    "model err",
)


def _f(x: float, fmt: str) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def _pct(x: float) -> str:
    return "-" if math.isnan(x) else f"{100 * x:.1f}%"


def memory_lines(a: Analysis) -> list[str]:
    """Peak memory per pipeline stage (the rank of each stage that used most), per point."""
    return [
        f"{s.label} N={p.n}: "
        + ", ".join(f"stage {k} {b / 2**20:.0f} MiB" for k, b in enumerate(p.peak_by_stage))
        for s in a.series
        for p in s.points
        if len(p.peak_by_stage) > 1
    ]


def rows(a: Analysis) -> list[list[str]]:
    out = []
    for label, p in ((s.label, p) for s in a.series for p in s.points):
        err = (p.model_step_s - p.step_s) / p.step_s if p.model_step_s == p.model_step_s else float("nan")
        out.append(
            [
                label,
                str(p.n),
                str(p.reps),
                _f(p.throughput, ".1f"),
                _f(p.throughput_ci95, ".1f"),
                _f(p.speedup, ".2f"),
                _f(100 * p.efficiency, ".1f") + "%",
                _f(100 * p.comm_share, ".1f") + "%",
                _f(100 * p.data_share, ".1f") + "%",
                _pct(p.bubble_share),
                _pct(p.bubble_theory),
                _f(max(p.peak_by_stage) / 2**20 if p.peak_by_stage else float("nan"), ".0f"),
                _f(p.karp_flatt, ".3f"),
                _f(1e3 * p.step_s, ".2f"),
                _f(1e3 * p.model_step_s, ".2f"),
                _f(100 * err, "+.1f") + "%" if err == err else "-",
            ]
        )
    return out


def terminal_table(a: Analysis) -> Table:
    t = Table(title=f"{a.kind} scaling")
    for c in COLUMNS:
        t.add_column(c, justify="right")
    for r in rows(a):
        t.add_row(*r)
    return t


def model_lines(a: Analysis) -> list[str]:
    """The Amdahl and alpha-beta fits of each series (named when a study compares several)."""
    lines = []
    for s in a.series:
        lines += [f"{s.label}: {x}" if a.compares else x for x in _fit_lines(s)]
    return lines


def _fit_lines(s: Series) -> list[str]:
    lines = []
    if s.kind == "strong" and s.no_speedup:
        lines.append(
            "Amdahl fit: no speedup at this scale (the runs got slower with more ranks; "
            "no serial fraction or speedup limit can be fitted)"
        )
    elif s.kind == "strong" and s.amdahl_serial_fraction == s.amdahl_serial_fraction:
        lines.append(
            f"Amdahl fit: serial fraction s = {s.amdahl_serial_fraction:.4f} "
            f"(speedup limit 1/s = {1 / s.amdahl_serial_fraction:.1f}x)"
            if s.amdahl_serial_fraction > 0
            else f"Amdahl fit: serial fraction s = {s.amdahl_serial_fraction:.4f}"
        )
    if s.alpha_beta and s.step_model:
        ab, m = s.alpha_beta, s.step_model
        lines.append(
            f"α–β fit of the allreduce: α = {1e6 * ab.alpha_s:.1f} µs, "
            f"bandwidth 1/β = {ab.bandwidth_bytes_per_s / 1e9:.2f} GB/s; gradients "
            f"{m.gradient_bytes / 2**20:.2f} MiB; exposed share of the allreduce f = {m.exposed_fraction:.2f}"
        )
    return lines


def predictions(a: Analysis) -> list[tuple[str, dict[str, float]]]:
    return [(s.label, q) for s in a.series for q in s.predictions]


def markdown(a: Analysis, images: list[Path]) -> str:
    md = [
        f"# {a.kind.capitalize()} scaling report",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    md += ["| " + " | ".join(r) + " |" for r in rows(a)]
    md += [""] + [f"- {line}" for line in model_lines(a)]
    if predictions(a):
        md += [
            "",
            "## Prediction beyond the measured scales (α–β model + measured compute)",
            "",
            "| series | ranks | batch per rank | step ms | samples/s | efficiency |",
            "|---|---|---|---|---|---|",
        ]
        md += [
            f"| {e} | {q['n']} | {q['batch_per_rank']:.1f} | {1e3 * q['step_s']:.2f} | {q['throughput']:.1f} | "
            f"{100 * q['efficiency']:.1f}% |"
            for e, q in predictions(a)
        ]
    if memory_lines(a):
        md += ["", "## Peak memory per pipeline stage", ""] + [f"- {x}" for x in memory_lines(a)]
    if a.missing:
        md += ["", f"## Missing or failed runs ({len(a.missing)})", ""] + [f"- `{m}`" for m in a.missing]
    if a.corrupt:
        md += ["", f"## Unreadable records ({len(a.corrupt)})", ""] + [f"- {c}" for c in a.corrupt]
    md += ["", "## Plots", ""] + [f"![{p.stem}]({p.name})" for p in images]
    md += [
        "",
        "Formulas: efficiency strong T1/(N·TN), weak X_N/(N·X_1); Karp–Flatt e = (1/S − 1/N)/(1 − 1/N); "
        "pipeline bubble (p − 1)/(m + p − 1) (GPipe, 1F1B); "
        "busbw = algbw·2(n−1)/n (nccl-tests); ring allreduce 2(n−1)α + 2(n−1)/n·m·β (Hockney).",
    ]
    return "\n".join(md) + "\n"


def html_page(a: Analysis, md_text: str, images: list[Path]) -> str:
    """Self-contained: the plots are embedded as data URIs."""
    body = [
        f"<h1>{html.escape(a.kind.capitalize())} scaling report</h1>",
        "<table border=1 cellpadding=4>",
        "<tr>" + "".join(f"<th>{html.escape(c)}</th>" for c in COLUMNS) + "</tr>",
    ]
    body += ["<tr>" + "".join(f"<td>{html.escape(v)}</td>" for v in r) + "</tr>" for r in rows(a)]
    body.append("</table><ul>" + "".join(f"<li>{html.escape(x)}</li>" for x in model_lines(a)) + "</ul>")
    if memory_lines(a):
        body.append(
            "<h2>Peak memory per pipeline stage</h2><ul>"
            + "".join(f"<li>{html.escape(x)}</li>" for x in memory_lines(a))
            + "</ul>"
        )
    if predictions(a):
        body.append(
            "<h2>Prediction beyond the measured scales</h2><table border=1 cellpadding=4>"
            "<tr><th>series</th><th>ranks</th><th>step ms</th><th>samples/s</th><th>efficiency</th></tr>"
            + "".join(
                f"<tr><td>{html.escape(e)}</td><td>{q['n']}</td><td>{1e3 * q['step_s']:.2f}</td>"
                f"<td>{q['throughput']:.1f}</td><td>{100 * q['efficiency']:.1f}%</td></tr>"
                for e, q in predictions(a)
            )
            + "</table>"
        )
    if a.missing:
        body.append(
            "<h2>Missing or failed runs</h2><ul>"
            + "".join(f"<li>{html.escape(m)}</li>" for m in a.missing)
            + "</ul>"
        )
    if a.corrupt:
        body.append(
            "<h2>Unreadable records</h2><ul>"
            + "".join(f"<li>{html.escape(c)}</li>" for c in a.corrupt)
            + "</ul>"
        )
    for p in images:
        data = base64.b64encode(p.read_bytes()).decode()
        body.append(
            f'<h3>{html.escape(p.stem)}</h3><img alt="{html.escape(p.stem)}" src="data:image/png;base64,{data}">'
        )
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>hpctrain scaling report</title></head><body>"
        + "\n".join(body)
        + "</body></html>\n"
    )


def write_report(a: Analysis, out: Path) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    images = write_plots(a, out)
    with open(out / "points.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(COLUMNS)
        w.writerows(rows(a))
    md = markdown(a, images)
    (out / "report.md").write_text(md)
    (out / "report.html").write_text(html_page(a, md, images))
    return {
        "csv": out / "points.csv",
        "markdown": out / "report.md",
        "html": out / "report.html",
        **{p.stem: p for p in images},
    }
