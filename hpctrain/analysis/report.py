"""A study's report: terminal table, CSV, Markdown, and a self-contained HTML page."""

from __future__ import annotations

import base64
import csv
import html
import math
from pathlib import Path

from rich.table import Table

from hpctrain.analysis.analyze import Analysis, Prediction, Series, interval_note
from hpctrain.analysis.plots import write_plots
from hpctrain.analysis.points_csv import csv_columns, csv_rows

# the points table: these columns, each part's of the study's runs between (analysis/study_parts.py:
# a pipeline's bubble, its theory, transfers and overhead), then AFTER
BEFORE = (
    "series",
    "N",
    "reps",
    "samples/s",
    "samples/s range",
    "speedup",
    "effic.",
    "effic. range",
    "MFU",
    "comm",
    "wait",
    "data",
)
AFTER = (
    "peak MiB",
    "state MiB",
    "K–F e",
    "step ms",
    "node-h",
    "node-h/1k",
    "model ms",
    "model err",
    "LOO err",
)


def _f(x: float, fmt: str) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def _pct(x: float) -> str:
    return "-" if math.isnan(x) else f"{100 * x:.1f}%"


def _err(model: float, measured: float) -> str:
    return "-" if math.isnan(model) else f"{100 * (model / measured - 1):+.1f}%"


def memory_lines(a: Analysis) -> list[str]:
    """Peak memory per pipeline stage (the rank of each stage that used most), per point."""
    return [
        f"{s.label} N={p.n}: "
        + ", ".join(f"stage {k} {b / 2**20:.0f} MiB" for k, b in enumerate(p.peak_by_stage))
        for s in a.series
        for p in s.points
        if len(p.peak_by_stage) > 1
    ]


def columns(a: Analysis) -> list[str]:
    """The points table's columns, the parts' of the study's runs among them."""
    return [*BEFORE, *(c for view in a.parts.values() for c in view.columns), *AFTER]


def rows(a: Analysis) -> list[list[str]]:
    out = []
    for label, p in ((s.label, p) for s in a.series for p in s.points):
        eff = p.efficiency_ci
        out.append(
            [
                label,
                str(p.n),
                str(p.reps),
                _f(p.throughput, ".1f"),
                p.throughput_ci.text(".1f"),
                _f(p.speedup, ".2f"),
                _f(100 * p.efficiency, ".1f") + "%",
                f"{100 * eff.lo:.1f}–{100 * eff.hi:.1f}%" if eff.known else "-",
                _pct(p.mfu),
                _f(100 * p.comm_share, ".1f") + "%",
                _pct(p.imbalance_s / p.step_s if p.n > 1 else math.nan),
                _f(100 * p.data_share, ".1f") + "%",
                *(c for key, view in a.parts.items() for c in view.cells(p.parts.get(key, {}), p.step_s)),
                _f(max(p.peak_by_stage) / 2**20 if p.peak_by_stage else float("nan"), ".0f"),
                _f(p.state_bytes / 2**20, ".1f"),
                _f(p.karp_flatt, ".3f"),
                _f(1e3 * p.step_s, ".2f"),
                _f(p.node_hours, ".4f"),
                _f(p.node_hours_per_1k, ".2e"),
                _f(1e3 * p.model_step_s, ".2f"),
                _err(p.model_step_s, p.step_s),
                _err(p.loo_step_s, p.step_s),
            ]
        )
    return out


def shown(a: Analysis) -> tuple[list[str], list[list[str]]]:
    """The columns with something in them (a data-parallel study has no bubble or stage memory)."""
    table, head = rows(a), columns(a)
    keep = [i for i, c in enumerate(head) if any(r[i] not in ("-", "-%") for r in table) or not table]
    return [head[i] for i in keep], [[r[i] for i in keep] for r in table]


# A page's tables are split in two, each narrow enough for a page or a documentation site's
# column (one of 17 columns was cut at the page's edge): the scaling, then where the time goes,
# memory, cost and the step model; both start with the point's series and N.
KEY_COLUMNS = ("series", "N")
SCALING_COLUMNS = ("reps", "samples/s", "samples/s range", "speedup", "effic.", "effic. range", "MFU")
HALVES = ("Scaling", "Where the time goes, memory, cost and the step model")


def halves(a: Analysis) -> list[tuple[str, list[str], list[list[str]]]]:
    """The points table as two: (title, columns, rows) of the scaling, then of the rest."""
    head, table = shown(a)
    out = []
    for title, first in zip(HALVES, (True, False)):
        keep = [i for i, c in enumerate(head) if c in KEY_COLUMNS or (c in SCALING_COLUMNS) == first]
        out.append((title, [head[i] for i in keep], [[r[i] for i in keep] for r in table]))
    return out


# the terminal keeps its table narrow enough for a wide terminal: these have lines of their own
ON_THEIR_OWN_LINES = ("MFU",)


def terminal_table(a: Analysis) -> Table:
    columns, table = shown(a)
    keep = [i for i, c in enumerate(columns) if c not in ON_THEIR_OWN_LINES]
    columns, table = [columns[i] for i in keep], [[r[i] for i in keep] for r in table]
    t = Table(title=f"{a.kind} scaling", caption=interval_note(a))
    for c in columns:
        t.add_column(c, justify="right")
    for r in table:
        t.add_row(*r)
    return t


def cost_lines(a: Analysis) -> list[str]:
    """Per series: the scale whose result costs the fewest node-hours, next to the fastest."""
    lines = []
    for s in a.series:
        priced = [p for p in s.points if p.node_hours_per_1k == p.node_hours_per_1k]
        if len(priced) < 2:
            continue
        cheap = min(priced, key=lambda p: p.node_hours_per_1k)
        fast = max(priced, key=lambda p: p.throughput)
        name = f"{s.label}: " if a.compares else ""
        per_step = cheap.node_hours_per_1k * cheap.batch_per_rank * cheap.n / 1e3  # x samples per step
        lines.append(
            f"{name}cost per result: N={cheap.n} needs the fewest node-hours per 1,000 samples "
            f"({cheap.node_hours_per_1k:.2e}; {per_step:.2e} per step); N={fast.n} is fastest "
            f"({fast.throughput:.1f} samples/s, {fast.node_hours_per_1k / cheap.node_hours_per_1k:.2f}x the "
            "node-hours per sample)"
        )
    return lines


def mfu_lines(a: Analysis) -> list[str]:
    """Per series with model FLOPs recorded: MFU at each scale, and at the predicted ones."""
    lines = []
    for s in a.series:
        known = [p for p in s.points if math.isfinite(p.mfu)]
        if not known:
            continue
        name = f"{s.label}: " if a.compares else ""
        measured = ", ".join(f"N={p.n} {100 * p.mfu:.1f}%" for p in known)
        predicted = ", ".join(f"N={q.n} {100 * q.mfu:.1f}%" for q in s.predictions if math.isfinite(q.mfu))
        lines.append(
            f"{name}MFU (model FLOPs utilisation, against {known[0].peak_source}): {measured}"
            + (f"; predicted {predicted}" if predicted else "")
        )
    return lines


def model_lines(a: Analysis) -> list[str]:
    """The Amdahl and alpha-beta fits of each series (named when a study compares several)."""
    lines = []
    for s in a.series:
        lines += [f"{s.label}: {x}" if a.compares else x for x in _fit_lines(s)]
    return lines


def _pm(value: float, se: float, scale: float, fmt: str) -> str:
    if not math.isfinite(value):  # e.g. 1/β of a fitted β = 0, or f without a multi-rank run
        return "not determined"
    return (
        f"{format(scale * value, fmt)} ± {format(scale * se, fmt)}"
        if math.isfinite(se)
        else format(scale * value, fmt)
    )


def _fit_lines(s: Series) -> list[str]:
    lines = []
    if s.kind == "strong" and s.no_speedup:
        lines.append(
            f"Amdahl fit: Amdahl's law does not describe these measurements (fitted serial fraction "
            f"{s.amdahl_serial_fraction:.2f}, outside [0, 1), or a scale got slower with more ranks)"
        )
    elif s.kind == "strong" and s.amdahl_serial_fraction == s.amdahl_serial_fraction:
        a = s.amdahl_serial_fraction
        lines.append(
            f"Amdahl fit (± standard error): serial fraction s = {_pm(a, s.amdahl_se, 1, '.4f')}"
            + (f" (speedup limit 1/s = {1 / a:.1f}x)" if a > 0 else "")
        )
    if s.comm and s.step_model:
        c, m = s.comm, s.step_model
        lines.append(
            f"allreduce fit (± standard error): α = {_pm(c.alpha_s, c.alpha_se, 1e6, '.1f')} µs, "
            f"engine latency L = {_pm(c.latency_s, c.latency_se, 1e3, '.2f')} ms, "
            f"bandwidth 1/β = {_pm(c.bandwidth_bytes_per_s, c.beta_se * c.bandwidth_bytes_per_s**2, 1e-9, '.2f')} GB/s"
        )
        lines.append(
            f"step model: gradients {m.grad_bytes / 2**20:.2f} MiB in {m.messages} message(s); exposed share "
            f"of the allreduce f = {_pm(m.exposed_raw, m.exposed_se, 1, '.2f')}"
            + ("" if math.isfinite(m.exposed_se) else " (one multi-rank run: no uncertainty)")
        )
        for c_ in m.checks:
            if c_.held_out is None:
                why = f": {c_.why}" if c_.why else ""
                lines.append(f"leave-one-out N={c_.scale.n}: not possible{why}")
            else:
                lines.append(
                    f"leave-one-out N={c_.scale.n}: {100 * c_.loo_err:+.1f}% "
                    f"(in-sample {100 * c_.in_sample_err:+.1f}%); most of it in {c_.term}: {c_.why}"
                )
        if not m.described:
            lines.append(
                "the model does not describe these measurements, so it predicts nothing: "
                + "; ".join(m.problems)
            )
    return lines


def predictions(a: Analysis) -> list[tuple[str, Prediction]]:
    return [(s.label, q) for s in a.series for q in s.predictions]


def _range(q: Prediction) -> str:
    if not math.isfinite(q.band):
        return "unchecked"
    lo, hi = q.throughput_range()
    return f"{lo:.1f}–{hi:.1f}"


def roofline_lines(a: Analysis) -> list[str]:
    return [
        (f"{s.label} " if a.compares else "") + f"N={p.n}: {p.roofline.line()}"
        for s in a.series
        for p in s.points
        if p.roofline is not None
    ]


PREDICTION_COLUMNS = (
    "series",
    "ranks",
    "batch per rank",
    "step ms",
    "samples/s",
    "samples/s range",
    "efficiency",
)
FORMULAS = (
    "Columns: comm is the exposed communication per step, wait the part of it spent waiting for the "
    "slowest rank (load imbalance). "
    "Formulas: efficiency E = X_N/(N·X_1) = S/N (strong, fixed global batch: T1/(N·TN)); Karp–Flatt e = (1/S − 1/N)/(1 − 1/N); "
    "pipeline bubble (p − 1)/(m + p − 1) (GPipe, 1F1B); busbw = algbw·2(n−1)/n (nccl-tests); "
    "ring allreduce L + 2(n−1)α + 2(n−1)/n·m·β (Hockney, plus the engine's latency L); "
    "95% ranges from Student's t on log throughput (3+ repetitions), else min–max; "
    "leave-one-out: each scale predicted from the others."
)


def prediction_rows(a: Analysis) -> list[list[str]]:
    return [
        [
            e,
            str(q.n),
            f"{q.batch_per_rank:.1f}",
            f"{1e3 * q.step_s:.2f}",
            f"{q.throughput:.1f}",
            _range(q),
            f"{100 * q.efficiency:.1f}%",
        ]
        for e, q in predictions(a)
    ]


def sections(a: Analysis) -> list[tuple[str, list[str]]]:
    """The report's headed lists after the main table (empty ones left out)."""
    out = [
        ("Fits and their validation", model_lines(a)),
        ("Model FLOPs utilisation", mfu_lines(a)),
        ("Cost per result (node-hours)", cost_lines(a)),
        ("Communication roofline (gradients on the measured allreduce curve)", roofline_lines(a)),
        ("Peak memory per pipeline stage", memory_lines(a)),
        *((view.section, lines) for view, lines in a.part_lines),
        ("Containers the ranks ran in", a.containers),
        ("Placement: allocations and nodes", a.placement),
        (f"Missing or failed runs ({len(a.missing)})", [f"`{m}`" for m in a.missing]),
        (f"Unreadable records ({len(a.corrupt)})", list(a.corrupt)),
    ]
    return [(title, lines) for title, lines in out if lines]


def _md_table(head: list[str] | tuple[str, ...], body: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + [
        "| " + " | ".join(r) + " |" for r in body
    ]


def markdown(a: Analysis, images: list[Path]) -> str:
    md = [f"# {a.kind.capitalize()} scaling report"]
    for title, columns, table in halves(a):
        md += ["", f"## {title}", ""] + _md_table(columns, table)
    md += ["", interval_note(a)]
    if predictions(a):
        md += ["", "## Prediction beyond the measured scales (band: the largest leave-one-out error)", ""]
        md += _md_table(PREDICTION_COLUMNS, prediction_rows(a))
    for title, lines in sections(a):
        md += ["", f"## {title}", ""] + [f"- {x}" for x in lines]
    md += ["", "## Plots", ""] + [f"![{p.stem}]({p.name})" for p in images]
    md += ["", FORMULAS]
    return "\n".join(md) + "\n"


def _html_table(head: list[str] | tuple[str, ...], body: list[list[str]]) -> str:
    return (
        "<table border=1 cellpadding=4><tr>"
        + "".join(f"<th>{html.escape(c)}</th>" for c in head)
        + "</tr>"
        + "".join("<tr>" + "".join(f"<td>{html.escape(v)}</td>" for v in r) + "</tr>" for r in body)
        + "</table>"
    )


def html_page(a: Analysis, md_text: str, images: list[Path]) -> str:
    """Self-contained: the plots are embedded as data URIs."""
    body = [f"<h1>{html.escape(a.kind.capitalize())} scaling report</h1>"]
    for title, columns, table in halves(a):
        body += [f"<h2>{html.escape(title)}</h2>", _html_table(columns, table)]
    body.append(f"<p>{html.escape(interval_note(a))}</p>")
    if predictions(a):
        body.append("<h2>Prediction beyond the measured scales</h2>")
        body.append(_html_table(PREDICTION_COLUMNS, prediction_rows(a)))
    for title, lines in sections(a):
        body.append(
            f"<h2>{html.escape(title)}</h2><ul>"
            + "".join(f"<li>{html.escape(x)}</li>" for x in lines)
            + "</ul>"
        )
    for p in images:
        data = base64.b64encode(p.read_bytes()).decode()
        body.append(
            f'<h3>{html.escape(p.stem)}</h3><img alt="{html.escape(p.stem)}" src="data:image/png;base64,{data}">'
        )
    body.append(f"<p>{html.escape(FORMULAS)}</p>")
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
        w.writerow(csv_columns(a))
        w.writerows(csv_rows(a))
    md = markdown(a, images)
    (out / "report.md").write_text(md)
    (out / "report.html").write_text(html_page(a, md, images))
    return {
        "csv": out / "points.csv",
        "markdown": out / "report.md",
        "html": out / "report.html",
        **{p.stem: p for p in images},
    }
