"""Output that is not a terminal (pipes, SLURM log files, CI) stays readable: tables are never
cut and a log line stays one line."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

from hpctrain.bench.analyze import synthetic_study
from hpctrain.ui import RichReporter, make_console
from tests.conftest import ROOT


def test_analyze_table_is_full_width_in_a_pipe(tmp_path: Path) -> None:
    study = synthetic_study(tmp_path / "study", 16)
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    r = subprocess.run(
        [sys.executable, "-m", "hpctrain.cli", "analyze", str(study)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    header = next(line for line in r.stdout.splitlines() if "samples/s" in line)
    for column in ("N", "reps", "samples/s", "range", "speedup", "effic.", "K–F e", "model err", "LOO err"):
        assert column in header, header
    assert "…" not in r.stdout  # nothing was cut to fit 80 columns


def test_a_long_log_line_stays_one_line_when_not_a_terminal() -> None:
    out = io.StringIO()
    reporter = RichReporter(make_console(out))
    line = "step 10/10  " + "x" * 300
    reporter.line(line)
    reporter.note("run directory " + "/very/long/path" * 20)
    assert out.getvalue().splitlines() == [line, "run directory " + "/very/long/path" * 20]
