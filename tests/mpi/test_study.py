"""A real local strong-scaling study at 1 and 2 ranks: runs, allreduce benchmark, report, resume."""

from __future__ import annotations

import csv
import json
import re
import shutil
import statistics
from pathlib import Path

import pytest

from tests.conftest import flat, hpctrain, wait_for

pytestmark = pytest.mark.mpi


def test_local_study_produces_the_full_report_and_resumes(strong_study: tuple[Path, str]) -> None:
    study, printed = strong_study
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
        "mfu.png",
        "breakdown.png",
        "busbw.png",
        "roofline.png",
    ):
        assert (report / name).stat().st_size > 0, name
    check_report_against_the_run_records(study, printed)

    # An interrupted study: one run never finished. Resume runs only that one.
    (study / "n2-r1" / "summary.json").unlink()
    r = hpctrain("study", "resume", str(study), "--no-progress", timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "3 run(s) already finished; running the other 1" in r.stdout
    assert (study / "n2-r1" / "summary.json").exists()
    assert len(list(study.glob("n2-r1.failed-*"))) == 1  # the unfinished attempt is kept aside
    assert "study run 1/1: n2-r1" in r.stdout


def check_report_against_the_run_records(study: Path, terminal: str, kind: str = "strong") -> None:
    """Every figure of points.csv recomputed from the runs' summary.json files (2 reps at N = 1, 2);
    the Markdown table holds the same rows, the HTML embeds the four plots, and the terminal shows
    the model-error column and the Amdahl and alpha-beta fits."""
    report = study / "report"
    s = {n: [json.loads((study / f"n{n}-r{k}" / "summary.json").read_text()) for k in (0, 1)] for n in (1, 2)}

    def mean(n: int, key: str) -> float:
        return statistics.fmean(x[key] for x in s[n])

    x = {n: mean(n, "throughput_samples_per_s") for n in (1, 2)}
    t = {n: mean(n, "step_s") for n in (1, 2)}
    rows = list(csv.DictReader((report / "points.csv").open()))
    assert [int(row["ranks"]) for row in rows] == [1, 2] and {row["reps"] for row in rows} == {"2"}
    for row in rows:
        n = int(row["ranks"])
        pair = [v["throughput_samples_per_s"] for v in s[n]]
        # two repetitions: min-max, not a t interval (t(0.975, 1) = 12.7 would reach below zero)
        lo, hi = float(row["throughput_lo_samples_per_s"]), float(row["throughput_hi_samples_per_s"])
        assert (lo, hi) == pytest.approx((min(pair), max(pair)))
        assert float(row["throughput_samples_per_s"]) == pytest.approx(x[n])
        assert float(row["speedup"]) == pytest.approx(x[n] / x[1])
        # E = X_N / (N X_1) = S / N from mean throughputs in both kinds (T1 / (N TN) for one
        # repetition each; from means the two differ, and only S / N lies inside S's interval / N)
        assert float(row["efficiency"]) == pytest.approx(x[n] / (n * x[1]))
        assert float(row["comm_share"]) == pytest.approx(mean(n, "comm_s") / t[n])
        assert float(row["step_ms"]) == pytest.approx(1e3 * t[n])
        assert row["model_step_ms"] != "" and row["model_error"] != ""
    # leave-one-out: N=1 (no communication) is predicted from N=2's compute; N=2 has no other
    # multi-rank scale to fit its overlap from
    assert rows[0]["loo_error"] != "" and rows[1]["loo_error"] == ""
    # the efficiency range of N=2 propagates from both throughput ranges (min-max: extreme ratios)
    lo, hi = float(rows[1]["efficiency_lo"]), float(rows[1]["efficiency_hi"])
    x_lo, x_hi = min(pair := [v["throughput_samples_per_s"] for v in s[2]]), max(pair)
    b_lo, b_hi = min(b := [v["throughput_samples_per_s"] for v in s[1]]), max(b)
    assert (lo, hi) == pytest.approx((x_lo / b_hi / 2, x_hi / b_lo / 2))
    md = (report / "report.md").read_text()
    # the Markdown table leaves out the columns empty at every point; neither it nor points.csv
    # has a pipeline's (bubble, theory), which only runs with a pipeline part bring
    header = [
        c for line in md.splitlines() if line.startswith("| series |") for c in line.strip("| ").split(" | ")
    ]
    assert "bubble" not in header and not any(c.startswith("pipeline_") for c in rows[0])
    for row in rows:  # the table shows the CSV's figures, rounded
        shown = f"| {row['series']} | {row['ranks']} | 2 | {float(row['throughput_samples_per_s']):.1f} |"
        assert shown in md, (shown, md)
    # predictions only from a model that describes the runs; either way the report says which
    assert ("Prediction beyond the measured scales" in md and "| 8 |" in md) != (
        "the model does not describe these measurements" in md
    )
    page = (report / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 6
    for plot in ("throughput", "efficiency", "mfu", "breakdown", "busbw", "roofline"):
        assert f'alt="{plot}"' in page
    # every run counted its model FLOPs: MFU per scale, on a line of its own (the table stays narrow)
    assert re.search(
        r"MFU \(model FLOPs utilisation, against probe: .*\): N=1 [0-9.]+%, N=2 [0-9.]+%", terminal
    )
    assert "model err" in terminal and "LOO err" in terminal and "samples/s" in terminal
    assert "allreduce fit (± standard error)" in terminal and "leave-one-out N=1:" in terminal
    # the roofline of the 2-rank point: the gradients' bytes, expected vs exposed, and a verdict
    assert re.search(
        r"roofline N=2: [0-9.]+ MiB of gradients in 1 message\(s\).*(latency|bandwidth)-bound", terminal
    )
    # Amdahl's law is about a fixed problem: a fit, or the reason none describes these timings
    # (which of the two depends on the machine's load: 2 ranks on 2 busy cores may not speed up)
    amdahl = re.search(
        r"Amdahl fit( \(± standard error\): serial fraction|: Amdahl's law does not)", terminal
    )
    assert bool(amdahl) == (kind == "strong"), terminal


def test_a_study_compares_engines_and_analyze_lists_failed_runs(tmp_path: Path) -> None:
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
        "study.engines=[horovod,ddp]",
        "data=digits",
        f"run.output_root={tmp_path}",
        "run.name=wk",
        timeout=600,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    [study] = list(tmp_path.glob("*/*-wk-weak"))
    names = [e["name"] for e in json.loads((study / "study.json").read_text())["runs"]]
    assert names == ["horovod-n1-r0", "ddp-n1-r0", "horovod-n2-r0", "ddp-n2-r0"]
    for name in names:  # each run trained with the engine it is named after
        assert json.loads((study / name / "summary.json").read_text())["engine"] == name.split("-")[0]
    rows = list(csv.DictReader((study / "report" / "points.csv").open()))
    assert [(row["series"], row["ranks"]) for row in rows] == [
        ("horovod", "1"),
        ("horovod", "2"),
        ("ddp", "1"),
        ("ddp", "2"),
    ]
    for row in rows:  # each engine's efficiency against its own 1-rank run: X_2 / (2 X_1)
        x = {
            n: json.loads((study / f"{row['series']}-n{n}-r0" / "summary.json").read_text())[
                "throughput_samples_per_s"
            ]
            for n in (1, 2)
        }
        eff = x[int(row["ranks"])] / (int(row["ranks"]) * x[1])
        assert float(row["efficiency"]) == pytest.approx(eff)

    shutil.rmtree(study / "ddp-n2-r0")
    r = hpctrain("analyze", str(study))
    assert r.returncode == 0, r.stderr
    assert "1 run(s) missing or failed: ddp-n2-r0" in r.stdout
    md = (study / "report" / "report.md").read_text()
    assert "ddp-n2-r0" in md and "| ddp | 1 |" in md and "| horovod | 2 |" in md


def test_a_pipeline_study_compares_micro_batches_and_reports_the_bubble(tmp_path: Path) -> None:
    r = hpctrain(
        "study",
        "strong",
        "--no-progress",
        "parallelism=pipeline",
        "model=mlp",
        "model.depth=4",
        "study.ranks=[2]",  # 2 stages (more stages: tests/mpi/test_pipeline.py)
        "study.microbatches=[2,4]",
        "study.repetitions=1",
        "study.steps=6",
        "study.warmup_steps=1",
        "study.global_batch=48",
        "study.allreduce_bench=false",
        "data=digits",
        f"run.output_root={tmp_path}",
        "run.name=pp",
        timeout=600,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    [study] = list(tmp_path.glob("*/*-pp-strong"))
    for name, stages in (("m2-n2-r0", 2), ("m4-n2-r0", 2)):
        s = json.loads((study / name / "summary.json").read_text())
        assert (flat(s)["stages"], s["world_size"], s["parallelism"]) == (stages, stages, "pipeline")
    rows = list(csv.DictReader((study / "report" / "points.csv").open()))
    assert [(row["series"], row["ranks"]) for row in rows] == [("horovod m=2", "2"), ("horovod m=4", "2")]
    for row in rows:  # theory (p - 1) / (m + p - 1) beside each measured bubble
        p, m = int(row["ranks"]), int(row["series"][-1])
        assert float(row["pipeline_bubble_theory"]) == pytest.approx((p - 1) / (m + p - 1))
        assert 0 < float(row["pipeline_bubble_share"]) < 1 and float(row["pipeline_bubble_s"]) > 0
    report = (study / "report" / "report.md").read_text()
    assert "## Peak memory per pipeline stage" in report
    # the step model, fitted on m=2 at each scale, predicts m=4 and the best count (of 1..16)
    for n in (2,):
        assert re.search(
            rf"N={n} horovod gpipe: from m=2 the model predicts m=(1|2|4|8|16) fastest \([0-9.]+ ms\); "
            rf"measured fastest m=[24] \([0-9.]+ ms\); its error at m=4 [+-][0-9.]+%",
            report,
        ), report
    r = hpctrain("bench", "predict", str(study))  # the same lines, without an allreduce benchmark
    assert r.returncode == 0 and "pipeline micro-batches: N=2 horovod gpipe: from m=2" in r.stdout, r.stdout


# a short study whose every point fails at its first step
FAILING = [
    "study.repetitions=1", "study.steps=4", "study.warmup_steps=1", "data=digits",
    "debug.fail_rank=0", "debug.fail_step=1",
]  # fmt: skip


def test_a_study_whose_every_run_fails_stops_before_the_benchmark_and_exits_4(tmp_path: Path) -> None:
    r = hpctrain(
        "study",
        "strong",
        "--no-progress",
        "study.ranks=[1,2]",
        *FAILING,
        f"run.output_root={tmp_path}",
        timeout=300,
    )
    assert r.returncode == 4, r.stdout + r.stderr
    assert (
        "every run of the study failed, the first: n1-r0 failed: rank 0 failed: InjectedFailure" in r.stderr
    )
    [study] = list(tmp_path.glob("*/*-strong"))
    assert not list(study.glob("allreduce-*")) and not (study / "report").exists()


def test_a_study_analyzed_as_a_job_returns_at_once_and_its_analysis_runs_last(tmp_path: Path) -> None:
    """--analyze-as-job: the command submits and returns; the points and then the analysis run
    without it (the local supervisor runs them one after another). Here the point fails: the
    analysis still runs after them, and fails saying there is nothing to report, which status
    shows. (The SLURM study test's report comes from an analysis job.)"""
    r = hpctrain(
        "study",
        "strong",
        "--analyze-as-job",
        "study.ranks=[1]",
        *FAILING,
        "study.allreduce_bench=false",  # the SLURM study test's analysis job gathers one
        f"run.output_root={tmp_path}",
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    [study] = list(tmp_path.glob("*/*-strong"))
    analysis = study / "analysis"
    assert json.loads((analysis / "state.json").read_text())["state"] == "PENDING"  # not waited for
    assert "submitted 1 run(s) and 0 allreduce benchmark(s)" in r.stdout, r.stdout
    assert f"its report will be {study / 'report'}/" in r.stdout, r.stdout

    def state(name: str) -> dict:
        return json.loads((study / name / "state.json").read_text())

    wait_for("the analysis job", lambda: state("analysis")["state"] not in ("PENDING", "RUNNING"), 240)
    assert state("n1-r0")["state"] == state("analysis")["state"] == "FAILED"
    assert state("analysis")["started"] >= state("n1-r0")["updated"]
    assert not (study / "report").exists()
    log = hpctrain("logs", str(analysis)).stdout
    assert "n1-r0: FAILED; left out" in log, log
    status = hpctrain("status", str(study)).stdout
    assert "2 runs: 2 failed" in status, status
    assert re.search(r"│ analysis +│ \d+_1 +│ FAILED +│.*AnalysisFailed: no finished run in", status), status


def test_estimates_come_from_one_probe_per_distinct_point_or_from_an_earlier_study(
    tmp_path: Path, strong_study: tuple[Path, str]
) -> None:
    """A sweep of step counts shares one probe (2 warm-up and 20 timed steps: the fewest a probe
    runs); a study estimated from the finished study above
    takes its two scales as measured and a third from its step model; evidence of another model
    is refused naming it; nothing is created where the runs would go."""
    out = tmp_path / "out"
    common = ["data=digits", "train.warmup_steps=2", f"run.output_root={out}"]
    r = hpctrain("run", "-m", "--estimate", *common, "train.steps=100,150", timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (
        r.stdout.count("probe ") == 1
        and "probe 1: point 0 (train.steps=100): 22 steps on 2 rank(s)" in r.stdout
    )
    rows = {line.split("│")[1].strip(): line for line in r.stdout.splitlines() if "measured at N=2" in line}
    assert set(rows) == {"point 0 (train.steps=100)", "point 1 (train.steps=150)"}, r.stdout
    assert "total: 2 run(s)" in r.stdout and "nothing was submitted" in r.stdout
    assert not out.exists()
    # each point's predicted memory per rank first, against this machine's share (not enforced)
    memory = [line for line in r.stdout.splitlines() if "(this machine's memory / 2 ranks)" in line]
    assert len(memory) == 2 and all(re.search(r"│\s+yes\s+│$", line) for line in memory), r.stdout

    study, _ = strong_study
    scales = ["study.ranks=[1,2,4]", "study.repetitions=1", "study.steps=500", "study.warmup_steps=2"]
    r = hpctrain(
        "study", "strong", "--estimate", "--from", str(study), *scales, "study.global_batch=32", *common
    )
    assert "probe" not in r.stdout, r.stdout
    has = {n: f"(this machine's memory / {n} ranks)" for n in (1, 2, 4)}
    assert [sum(has[n] in line for line in r.stdout.splitlines()) for n in (1, 2, 4)] == [1, 1, 1], r.stdout
    lines = {line.split("│")[1].strip(): line for line in r.stdout.splitlines() if "│ n" in line}
    assert "measured at N=1" in lines["n1-r0"] and "measured at N=2" in lines["n2-r0"], r.stdout
    # N=4 from the study's step model, or refused with the reason when the model does not
    # describe this machine's measurements (exit 1: an estimate is missing)
    if r.returncode == 0:
        assert "step model (2 scales, leave-one-out band)" in lines["n4-r0"], r.stdout
    else:
        assert r.returncode == 1 and "no estimate: n4-r0: the step model does not describe" in r.stdout
    r = hpctrain("study", "strong", "--estimate", "--from", str(study), *scales, "model=mlp", *common)
    assert r.returncode == 2 and f"{study} ran model=cnn, this point runs mlp" in r.stderr, r.stderr
    assert not out.exists()
    # a probe that fails ends the estimate with the rank's error; its records stay where it says
    r = hpctrain("run", "--estimate", *common, "debug.fail_rank=1", "debug.fail_step=3", timeout=300)
    assert r.returncode == 4 and "rank 1 failed: InjectedFailure" in r.stderr, r.stdout + r.stderr
    kept = Path(r.stdout.split("the failed probe's records are kept in ")[1].split()[0])
    assert (kept / "error-rank1.json").exists(), r.stdout
    shutil.rmtree(kept.parent)
