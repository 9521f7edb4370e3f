"""Output that is not a terminal (pipes, SLURM log files, CI) stays readable: tables are never
cut and a log line stays one line."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpctrain.bench.analyze import synthetic_study, synthetic_summary
from hpctrain.commands.ui import PROSE_WIDTH, RichReporter, make_console, print_summary
from tests.conftest import ROOT, replace_summary


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


def test_the_run_summary_stays_narrow_in_a_log_file_with_its_advice_below() -> None:
    # 2 ranks, 1 M parameters (4 MiB of gradients), a run probe of 2 ms and 10 ms: a roofline;
    # 30 ms exposed, 3x what the transfer takes: the advice is a long sentence
    s = replace_summary(
        synthetic_summary(2, 64, 0.050, 0.020, 0.030, 0.0), probe_small_s=2e-3, probe_full_s=10e-3
    )
    out = io.StringIO()
    print_summary(make_console(out), s)  # not a terminal: nothing is cut or wrapped by the console
    lines = out.getvalue().splitlines()
    advice = next(i for i, line in enumerate(lines) if line.startswith("to communicate faster: "))
    table = lines[:advice]
    assert any("roofline" in line for line in table) and not any("communicate faster" in x for x in table)
    assert max(len(line) for line in table) <= 110, "\n".join(table)
    assert all(len(line) <= PROSE_WIDTH for line in lines[advice:])
    said = " ".join(x.strip() for x in lines[advice:])
    assert len(lines) - advice >= 2 and said.startswith("to communicate faster: the step waits for something")


def test_tensor_parallel_collectives_sit_under_compute_with_their_replayed_time() -> None:
    # TP 2 on 4 ranks: 10 collectives of 1 MiB (all-reduce bytes) replayed in 8 ms of a 50 ms step
    s = replace_summary(
        synthetic_summary(4, 64, step=0.05, compute=0.04, comm=0.005, data=0.005),
        probe_small_s=1e-3,
        probe_full_s=3e-3,
        tp_degree=2,
        tp_messages=10,
        tp_bytes=2**20,
        tp_comm_s=8e-3,
    )
    out = io.StringIO()
    print_summary(make_console(out), s)
    lines = out.getvalue().splitlines()
    compute = next(i for i, line in enumerate(lines) if "compute (fwd+bwd+update)" in line)
    row = lines[compute + 1]
    assert "of which TP collectives (exposed)" in row and "8.00 ms (expected" in row, row
    assert "16.0% (10 collectives, 1.00 MiB)" in row, row
    assert max(len(line) for line in lines if line.startswith(("┃", "│"))) <= 110
    said = " ".join(x.strip() for x in lines)
    assert "measured 8.00 ms replayed alone" in said and "all exposed: 20% of the step's compute" in said


def test_status_of_a_large_sweep_lists_what_needs_attention_and_counts_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """60 runs: the counts cover all, the table lists the first 50 in attention order (the
    failed one first), and a line says how many are left out and how to list them (--all)."""
    import io

    from rich.console import Console

    from hpctrain import records
    from hpctrain.commands import jobs
    from hpctrain.launch.base import Job, JobStatus
    from hpctrain.orchestrate import runs as orchestrate

    ref = records.new(records.JobRef, launcher="slurm", job_id="7", world_size=1)
    found = [
        (Job(tmp_path / str(i), ref), JobStatus(f"7_{i}", "FAILED" if i == 59 else "COMPLETED"), "")
        for i in range(60)
    ]
    monkeypatch.setattr(orchestrate, "jobs_in", lambda path: [f[0] for f in found])
    monkeypatch.setattr(orchestrate, "statuses", lambda js: list(found))
    monkeypatch.setattr(
        orchestrate, "overrides_in", lambda path: {str(i): [f"train.seed={i}"] for i in range(60)}
    )

    def shown(show_all: bool) -> str:
        out = io.StringIO()
        assert jobs.status(tmp_path, Console(file=out, width=200), show_all=show_all) == 0
        return out.getvalue()

    text = shown(False)
    assert text.startswith("60 runs: 1 failed, 59 completed")
    rows = [line for line in text.splitlines() if "train.seed=" in line]
    assert len(rows) == 50 and "train.seed=59 " in rows[0]  # the failed run first
    assert "10 more run(s) not listed (10 completed)" in text and "--all lists every run" in text
    assert len([line for line in shown(True).splitlines() if "train.seed=" in line]) == 60


def test_the_summary_names_the_nodes_a_run_left_out_and_its_restarts() -> None:
    s = replace_summary(
        synthetic_summary(2, 64, step=0.05, compute=0.04, comm=0.005, data=0.005),
        restarts=1,
        steps_redone=2,
        restart_node_hours_lost=0.0253,
        nodes_excluded=["n2"],
        nodes_lost=["n4"],
    )
    out = io.StringIO()
    print_summary(make_console(out), s)
    rows = {line.split("│")[1].strip(): line for line in out.getvalue().splitlines() if line.count("│") >= 3}
    assert "n2 (pre-flight); n4 (lost)" in rows["nodes left out"], rows
    assert "2 step(s) redone, 0.0253 node-h lost" in rows["restarts after a failure"], rows
