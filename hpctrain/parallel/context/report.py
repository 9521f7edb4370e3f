"""Context parallelism in a run's summary (analysis/part_rows.py) and a study's report
(analysis/study_parts.py): what its K/V exchange costs of the step."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from statistics import fmean

from hpctrain.analysis.study_parts import StudyPart
from hpctrain.parallel.context.figures import ContextFigures
from hpctrain.records import RunSummary
from hpctrain.records.parts import part

ADVISE_ABOVE = 0.25  # of the step: where a smaller degree (a longer share per rank) is worth trying


def report_rows(s: RunSummary) -> list[tuple[str, str, str, str]]:
    f = part(s, ContextFigures)
    if f.degree <= 1:
        return []
    share = f"{100 * f.share:.1f}% " if math.isfinite(f.share) and f.share > 0 else ""
    rows = [
        (
            "step",
            "context-parallel K/V exchange (alone)",
            f"{1e3 * f.comm_s:.2f} ms",
            share + f"({f.exchanges:.0f} collectives per step, {f.kv_bytes / 2**20:.2f} MiB)",
        )
    ]
    if f.share > ADVISE_ABOVE:
        rows.append(
            (
                "advice",
                f"Context parallelism's K/V exchange costs {100 * f.share:.0f}% of the step: fewer cp ranks "
                "(a longer share of the sequence each) exchange less per token of attention.",
                "",
                "",
            )
        )
    return rows


def point_figures(runs: Sequence[RunSummary], step_s: float) -> dict[str, float]:
    """A point's K/V exchange per step (alone), the mean over its repetitions."""
    figures = [part(r, ContextFigures) for r in runs]
    return {"kv_s": fmean(f.comm_s for f in figures)} if figures and figures[0].degree > 1 else {}


def point_cells(f: Mapping[str, float], step_s: float) -> list[str]:
    kv = f.get("kv_s")
    return [f"{100 * kv / step_s:.1f}%" if kv is not None and step_s > 0 else "-"]


def _layout(r: RunSummary) -> str:
    n = part(r, ContextFigures).degree
    return f" cp={n}" if n > 1 else ""


# a study's view (analysis/study_parts.py): the exchange's share of the step, a column of the points
STUDY = StudyPart(figures=point_figures, columns=("K/V exch.",), cells=point_cells, layout=_layout)
