"""`hpctrain bench predict STUDY...`: how well the step-time model explains each study: every
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
from hpctrain.analysis.report import model_lines
from hpctrain.errors import HpctrainError

TARGET = 0.15  # leave-one-out error the model should stay within on this machine's studies


def _pct(x: float) -> str:
    return f"{100 * x:+.1f}%" if math.isfinite(x) else "-"


def run_predict(args: argparse.Namespace, console: Console) -> int:
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
        for line in a.pipeline:  # a pipeline study at several micro-batch counts: the best one
            console.print(f"  pipeline micro-batches: {line}", highlight=False)
    return 0
