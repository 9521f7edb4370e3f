"""The local tutorials' commands, run as the pages show them (tests/docs reads them from the pages):
docs/quickstart.md's first run learns the digits, its sweep runs its four points, and a
background run is followed and cancelled with the page's status, logs and cancel;
docs/tutorials/scaling-study.md's study runs, resumes with nothing left to do, and its report has
every file docs/tutorials/report.md describes. Only `run.dir` is added (and steps shortened), so
that the test knows where the records are."""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import pytest

from tests.conftest import hpctrain, wait_until_gone
from tests.docs.test_commands import page_command
from tests.docs.test_pages import DOCS, _table_first_cells

pytestmark = pytest.mark.mpi
PAGE = "docs/quickstart.md"


def test_the_first_run_learns_the_digits(tmp_path: Path) -> None:
    argv = page_command(PAGE, "hpctrain run data=digits")
    r = hpctrain(*argv, "--no-progress", f"run.dir={tmp_path / 'run'}")
    assert r.returncode == 0, r.stderr
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert s["world_size"] == 2 and s["heldout_accuracy"] > 0.9 and s["last_loss"] < 0.5
    for row in ("throughput", "exposed communication", "data wait", "held-out accuracy"):
        assert row in r.stdout  # the rows the page explains
    # the figures agree as the page defines them: the last progress line is rank 0's loss of its
    # last step; the summary's last loss is the mean of each rank's last 5 steps, over the ranks
    steps = {
        k: [json.loads(x) for x in (tmp_path / "run" / f"steps-rank{k}.jsonl").read_text().splitlines()]
        for k in (0, 1)
    }
    last_line = [x for x in r.stdout.splitlines() if x.startswith("step 100/100")][-1]
    assert f"loss {steps[0][-1]['loss']:.4f} (rank 0)" in last_line, last_line
    by_hand = statistics.fmean(statistics.fmean(x["loss"] for x in steps[k][-5:]) for k in (0, 1))
    assert s["last_loss"] == pytest.approx(by_hand, rel=1e-6)
    assert (
        f"{s['first_loss']:.4f} → {s['last_loss']:.4f}" in r.stdout
        and "last: mean of 5 steps, all ranks" in r.stdout
    )
    # every rank's log holds its own lines: the page's `logs --rank 1 --follow` (the run has ended)
    argv = [
        str(tmp_path / "run") if a == "outputs/<date>/<time>-train" else a
        for a in page_command(PAGE, "hpctrain logs")
    ]
    logs = hpctrain(*argv)
    assert logs.returncode == 0, logs.stderr
    assert f"step 100/100  loss {steps[1][-1]['loss']:.4f} (rank 1)" in logs.stdout, logs.stdout[-2000:]
    assert "(rank 0)" not in logs.stdout


def test_the_sweep_runs_every_point(tmp_path: Path) -> None:
    argv = page_command(PAGE, "hpctrain run -m")
    sweep = tmp_path / "sweep"
    r = hpctrain(*argv, "--no-progress", "train.steps=8", "train.warmup_steps=2", f"run.dir={sweep}")
    assert r.returncode == 0, r.stderr
    runs = json.loads((sweep / "sweep.json").read_text())["runs"]
    done = sorted(
        (s["precision"], s["world_size"])
        for s in (json.loads(p.read_text()) for p in sweep.glob("*/summary.json"))
    )
    assert len(runs) == 4 and done == [("bf16", 1), ("bf16", 2), ("fp32", 1), ("fp32", 2)]
    # one throughput per run: the sweep table's, status's and the summary's are the same figure
    for point in sorted(p for p in sweep.iterdir() if p.is_dir()):
        x = json.loads((point / "summary.json").read_text())["throughput_samples_per_s"]
        row = next(line for line in r.stdout.splitlines() if line.startswith(f"│ {point.name} "))
        assert f" {x:.1f} " in row, (x, row)
        st = hpctrain("status", str(point))
        assert f"{x:.1f} samples/s" in st.stdout and "the mean over the timed steps" in st.stdout, st.stdout


def test_a_background_run_is_followed_and_cancelled_with_the_pages_commands(tmp_path: Path) -> None:
    run_dir = tmp_path / "bg"
    r = hpctrain(*page_command(PAGE, "hpctrain run --no-wait"), f"run.dir={run_dir}")
    assert r.returncode == 0, r.stderr
    here = str(run_dir)

    def page(start: str) -> list[str]:
        return [here if a == "outputs/<date>/<time>-train" else a for a in page_command(PAGE, start)]

    st = hpctrain(*page("hpctrain status"))
    assert st.returncode == 0 and ("RUNNING" in st.stdout or "PENDING" in st.stdout), st.stdout
    # the page follows the log (--follow, until the run ends); here, once rank 1 has printed
    deadline = time.monotonic() + 120
    while not (run_dir / "logs" / "rank1.log").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    logs = hpctrain(*[a for a in page("hpctrain logs") if a != "--follow"])
    assert logs.returncode == 0, logs.stderr
    c = hpctrain(*page("hpctrain cancel"))
    assert c.returncode == 0, c.stderr
    wait_until_gone(run_dir)
    st = hpctrain(*page("hpctrain status"))
    assert "CANCELLED" in st.stdout, st.stdout


def test_the_scaling_study_tutorial_runs_resumes_and_reports(tmp_path: Path) -> None:
    study_page = "docs/tutorials/scaling-study.md"
    argv = page_command(study_page, "hpctrain study strong study.ranks=[1,2]", dry_run=False)
    home = tmp_path / "s-strong"  # a study's directory: run.dir plus its kind
    short = ["study.steps=12", "study.warmup_steps=2", "study.allreduce_max_mb=1"]
    r = hpctrain(*argv, "--no-progress", *short, f"run.dir={tmp_path / 's'}")
    assert r.returncode == 0, r.stdout + r.stderr
    runs = json.loads((home / "study.json").read_text())["runs"]
    assert sorted(x["name"] for x in runs) == [f"n{n}-r{k}" for n in (1, 2) for k in range(3)]
    resume = [str(home) if "<date>" in a else a for a in page_command(study_page, "hpctrain study resume")]
    again = hpctrain(*resume, "--no-progress")
    assert again.returncode == 0, again.stderr
    files = _table_first_cells((DOCS / "tutorials" / "report.md").read_text(), "file")
    written = {p.name for p in (home / "report").iterdir()}
    for entry in files:
        for name in (n.strip(" `") for n in entry.split(",")):
            assert name in written, f"the report page describes {name}; the study wrote {sorted(written)}"
