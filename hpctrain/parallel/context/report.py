"""Context parallelism in a run's summary (analysis/part_rows.py) and a study's report
(analysis/study_parts.py): what its K/V exchange costs of the step."""

from __future__ import annotations

import math

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


def _layout(r: RunSummary) -> str:
    n = part(r, ContextFigures).degree
    return f" cp={n}" if n > 1 else ""


STUDY = StudyPart(layout=_layout)
