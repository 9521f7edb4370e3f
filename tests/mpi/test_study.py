"""A real local strong-scaling study at 1 and 2 ranks: runs, allreduce benchmark, report, resume."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import hpctrain

pytestmark = pytest.mark.mpi


def test_local_study_produces_the_full_report_and_resumes(tmp_path: Path) -> None:
    r = hpctrain(
        "study",
        "strong",
        "--no-progress",
        "study.ranks=[1,2]",
        "study.repetitions=2",
        "study.steps=8",
        "study.warmup_steps=2",
        "study.global_batch=32",
        "study.allreduce_max_mb=1",
        "data=digits",
        f"run.output_root={tmp_path}",
        "run.name=st",
        timeout=900,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    [study] = list(tmp_path.glob("*/*-st-strong"))
    manifest = json.loads((study / "study.json").read_text())
    assert [(e["world_size"], e["rep"]) for e in manifest["runs"]] == [(1, 0), (1, 1), (2, 0), (2, 1)]
    bench = json.loads((study / "allreduce-n2.json").read_text())
    assert bench["n"] == 2 and bench["rows"][0]["bytes"] == 1024 and bench["rows"][-1]["bytes"] == 2**20
    report = study / "report"
    for name in (
        "report.md",
        "report.html",
        "points.csv",
        "throughput.png",
        "efficiency.png",
        "breakdown.png",
        "busbw.png",
    ):
        assert (report / name).stat().st_size > 0, name
    csv_rows = (report / "points.csv").read_text().splitlines()
    assert len(csv_rows) == 3 and csv_rows[1].startswith("1,2,") and csv_rows[2].startswith("2,2,")
    md = (report / "report.md").read_text()
    assert "Prediction beyond the measured scales" in md and "| 4 |" in md and "| 8 |" in md

    # An interrupted study: one run never finished. Resume runs only that one.
    (study / "n2-r1" / "summary.json").unlink()
    r = hpctrain("study", "resume", str(study), "--no-progress", timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "3 run(s) already finished; running the other 1" in r.stdout
    assert (study / "n2-r1" / "summary.json").exists()
    assert len(list(study.glob("n2-r1.failed-*"))) == 1  # the unfinished attempt is kept aside
    assert "study run 1/1: n2-r1" in r.stdout


def test_analyze_lists_failed_runs(tmp_path: Path) -> None:
    r = hpctrain(
        "study",
        "weak",
        "--no-progress",
        "study.ranks=[1,2]",
        "study.repetitions=1",
        "study.steps=6",
        "study.warmup_steps=1",
        "study.batch_per_rank=16",
        "study.allreduce_bench=false",
        "data=digits",
        f"run.output_root={tmp_path}",
        "run.name=wk",
        timeout=600,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    [study] = list(tmp_path.glob("*/*-wk-weak"))
    shutil.rmtree(study / "n2-r0")
    r = hpctrain("analyze", str(study))
    assert r.returncode == 0, r.stderr
    assert "1 run(s) missing or failed: n2-r0" in r.stdout
    assert "n2-r0" in (study / "report" / "report.md").read_text()
