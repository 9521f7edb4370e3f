"""`hpctrain bench predict [STUDY...]`: the step model against published multi-scale results
(analysis/published.py: fitted on the smaller scales, the larger predicted), then how well it
explains each recorded study: every
measured scale predicted with itself (in-sample) and without it (leave-one-out), the term that
carries the leave-one-out error, and whether the model describes the study at all; for pipeline
studies at several micro-batch counts, the count the pipeline terms predict fastest per scale."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from rich.console import Console
from rich.table import Table

from hpctrain.analysis.analyze import analyze_dir
from hpctrain.analysis.published import MISS, PUBLISHED, check, worst_beyond
from hpctrain.analysis.report import model_lines
from hpctrain.errors import HpctrainError

TARGET = 0.15  # leave-one-out error the model should stay within on this machine's studies


def _pct(x: float) -> str:
    return f"{100 * x:+.1f}%" if math.isfinite(x) else "-"


def show_published(console: Console) -> None:
    """The model fitted on each published result's smaller scales, predicting the larger ones."""
    for p in PUBLISHED:
        checks = check(p)
        t = Table(
            title=f"bench predict: {p.name}, {p.model}, {p.batch_per_gpu} images per GPU", caption=p.source
        )
        for col in ("GPUs", "published img/s", "predicted img/s", "error", ""):
            t.add_column(col, justify="right" if col else "left")
        for c in checks:
            rate = p.batch_per_gpu * c.gpus
            t.add_row(
                str(c.gpus),
                f"{p.images_per_s[c.gpus]:.1f}",
                f"{rate / c.predicted_s:.1f}",
                _pct(c.error),
                "fitted" if c.fitted else ("MISSES" if abs(c.error) > MISS else "predicted"),
            )
        console.print(t)
        worst = worst_beyond(checks)
        console.print(
            f"fitted up to {p.fit_upto} GPUs; largest error beyond: {100 * worst:.1f}%"
            + (f"; what the model lacks there: {p.misses}" if worst > MISS else ""),
            highlight=False,
            soft_wrap=True,
        )


def run_predict(args: argparse.Namespace, console: Console) -> int:
    show_published(console)
    for study in args.studies:
        a = analyze_dir(Path(study))
        if not a.points:
            raise HpctrainError(f"no finished run in {study}")
        for s in a.series:
            m = s.step_model
            title = f"bench predict: {a.kind} study {Path(study).name}" + (
                f" · {s.label}" if a.compares else ""
            )
            if m is None:
                console.print(
                    f"{title}: no allreduce benchmark in the study, so no step model", highlight=False
                )
                continue
            t = Table(title=title)
            for col in (
                "N",
                "reps",
                "measured ms",
                "in-sample ms",
                "in-sample err",
                "LOO ms",
                "LOO err",
                "LOO error in",
            ):
                t.add_column(col, justify="right" if col != "LOO error in" else "left")
            for p, c in zip(s.points, m.checks):
                t.add_row(
                    str(p.n),
                    str(p.reps),
                    f"{1e3 * p.step_s:.2f}",
                    f"{1e3 * c.in_sample.step_s:.2f}",
                    _pct(c.in_sample_err),
                    f"{1e3 * c.held_out.step_s:.2f}" if c.held_out else "-",
                    _pct(c.loo_err),
                    c.term or "-",
                )
            console.print(t)
            ins = max(abs(c.in_sample_err) for c in m.checks)
            loo = m.loo_band
            verdict = (
                "not checkable (no scale could be predicted from the others)"
                if not math.isfinite(loo)
                else f"{'within' if loo <= TARGET else 'beyond'} the {100 * TARGET:.0f}% target"
            )
            console.print(
                f"largest error: in-sample {100 * ins:.1f}%, leave-one-out "
                + (f"{100 * loo:.1f}%" if math.isfinite(loo) else "-")
                + f" ({verdict}); the model "
                + ("describes these runs" if m.described else "does NOT describe these runs"),
                highlight=False,
            )
        for line in model_lines(a):
            console.print(f"  {line}", highlight=False)
        for view, lines in a.part_lines:  # e.g. a pipeline study at several micro-batch counts: the best one
            for line in lines:
                console.print(f"  {view.label}: {line}", highlight=False)
    return 0
