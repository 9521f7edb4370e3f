"""Study analysis on synthetic run records with known answers; failed runs are listed."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from hpctrain import records
from hpctrain.analysis.analyze import analyze_dir, analyze_runs
from hpctrain.analysis.report import columns, write_report
from hpctrain.bench.analyze import synthetic_summary
from tests.conftest import replace_summary


def _run(
    n: int, step_ms: float, batch: int, comm_ms: float = 0.0, engine: str = "horovod"
) -> records.RunSummary:
    """A run's summary as the ranks write it (every rank alike; the wait for the slowest rank not
    measured)."""
    s = synthetic_summary(
        n, batch * n, step_ms / 1e3, (step_ms - comm_ms) / 1e3, comm_ms / 1e3, 0.0, 250_000, engine
    )
    return replace_summary(s, imbalance_s=float("nan"))


def _stage_peaks(s: records.RunSummary, peaks: tuple[int, ...]) -> records.RunSummary:
    """The summary with rank r holding pipeline stage r and peaking at peaks[r]."""
    per_rank = [replace_summary(r, stage=k, peak_memory_bytes=peaks[k]) for k, r in enumerate(s.per_rank)]
    return replace_summary(s, per_rank=per_rank)


def test_strong_study_by_hand() -> None:
    # global batch 64: 1 rank 100 ms/step, 2 ranks 60 ms, 4 ranks 40 ms
    a = analyze_runs(
        "strong", [_run(1, 100, 64), _run(2, 60, 32, comm_ms=10), _run(4, 40, 16, comm_ms=15)], []
    )
    p1, p2, p4 = a.points
    assert (p2.speedup, p4.speedup) == pytest.approx((100 / 60, 100 / 40))
    assert (p2.efficiency, p4.efficiency) == pytest.approx((100 / 120, 100 / 160))
    assert p2.karp_flatt == pytest.approx(0.2)
    assert p4.comm_share == pytest.approx(15 / 40)
    # Karp-Flatt is 0.2 at both scales ((1/2.5 - 1/4) / (1 - 1/4) = 0.2 at 4): Amdahl fits s = 0.2 exactly
    assert a.series[0].amdahl_serial_fraction == pytest.approx(0.2)


def test_weak_study_uses_throughput_form() -> None:
    a = analyze_runs("weak", [_run(1, 50, 32), _run(2, 55, 32), _run(4, 62.5, 32)], [])
    assert [p.efficiency for p in a.points] == pytest.approx([1.0, 50 / 55, 50 / 62.5])


def test_repetitions_give_mean_and_interval() -> None:
    runs = [_run(1, 100, 64), _run(1, 80, 64), _run(2, 60, 32), _run(2, 60, 32)]
    p1 = analyze_runs("strong", runs, []).points[0]
    assert p1.reps == 2 and p1.throughput == pytest.approx((640 + 800) / 2)
    # two repetitions: a t interval would be 720 +- 1016.5 (t = 12.7), reaching below zero; min-max instead
    assert (p1.throughput_ci.lo, p1.throughput_ci.hi) == (640, 800) and "min–max" in p1.throughput_ci.method
    # speedup 1066.7 / 720 from 2 ranks (exact 1066.7, min-max) over 1 rank (640..800): 1.333 .. 1.667
    p2 = analyze_runs("strong", runs, []).points[1]
    assert (p2.speedup_ci.lo, p2.speedup_ci.hi) == pytest.approx((1066.67 / 800, 1066.67 / 640), rel=1e-4)
    assert (p2.efficiency_ci.lo, p2.efficiency_ci.hi) == pytest.approx(
        (1066.67 / 1600, 1066.67 / 1280), rel=1e-4
    )


def test_model_prediction_and_error_with_allreduce_data() -> None:
    # Horovod's allreduce: L = 90 us over a wire (MPI) of alpha = 5 us, beta = 1 ns/B (exact at n = 2)
    bench = [
        records.AllreduceRow(n=2, bytes=b, iters=1, hvd_s=1e-4 + b / 1e9, mpi_s=1e-5 + b / 1e9)
        for b in (2**10, 2**16, 2**20, 2**24)
    ]
    runs = [_run(1, 100, 64), _run(2, 60, 32, comm_ms=0.55), _run(4, 40, 16, comm_ms=0.9)]
    a = analyze_runs("strong", runs, [], bench).series[0]
    assert a.comm is not None
    assert (a.comm.alpha_s, a.comm.latency_s, a.comm.beta_s_per_byte) == pytest.approx((5e-6, 9e-5, 1e-9))
    # gradients 250k x 4 B = 1 MB in one message: n = 2: 90 + 10 us + 1 ms = 1.1 ms; n = 4: 90 + 30 us
    # + 1.5 ms = 1.62 ms. Exposed 0.55 and 0.9 ms: f = (0.55 x 1.1 + 0.9 x 1.62) / (1.1^2 + 1.62^2)
    f = (0.55 * 1.1 + 0.9 * 1.62) / (1.1**2 + 1.62**2)
    m = a.step_model
    assert m is not None and m.described and m.exposed == pytest.approx(f)
    # in-sample: measured compute + f x expected
    assert [p.model_step_s for p in a.points] == pytest.approx(
        [0.1, 0.05945 + f * 1.1e-3, 0.0391 + f * 1.62e-3]
    )
    # leave N=4 out: f from N=2 alone = 0.55 / 1.1 = 0.5; compute on the line through (64, 100 ms)
    # and (32, 59.45 ms): 40.55 / 32 = 1.2671875 ms per sample + 18.9 ms per step
    assert a.points[2].loo_step_s == pytest.approx(18.9e-3 + 16 * 1.2671875e-3 + 0.5 * 1.62e-3)
    assert m.checks[2].term == "communication"  # 0.81 ms predicted, 0.9 measured; compute +0.075 ms
    # predictions at 8, 16, 32 ranks: compute on the least-squares line through all three scales
    # (c1 = Sxy / Sxx = 1515.47 / 1194.67 ms, c0 = 66.183 - c1 x 37.333 ms), f x expected allreduce
    c1 = 1515.4667 / 1194.6667
    step8 = (66.18333 - c1 * 37.33333 + 8 * c1) * 1e-3 + f * (9e-5 + 14 * 5e-6 + 1.75e-3)
    q = a.predictions[0]
    assert (q.n, q.batch_per_rank, q.step_s) == (8, 8, pytest.approx(step8))
    assert q.efficiency == pytest.approx(0.1 / (8 * step8))
    assert q.band == pytest.approx(max(abs(c.loo_err) for c in m.checks))
    lo, hi = q.throughput_range()
    assert 0 < lo < q.throughput < hi
    assert q.mfu != q.mfu  # these runs recorded no model FLOPs: no MFU to predict
    # with MFU measured at N=4 (40 ms a step of 16 samples), N=8 runs 8 samples in step8 per rank

    with_mfu = [replace_summary(r, mfu=0.5) for r in runs]
    q = analyze_runs("strong", with_mfu, [], bench).series[0].predictions[0]
    assert q.mfu == pytest.approx(0.5 * (8 / step8) / (16 / 0.04))


def test_a_model_outside_its_physical_range_predicts_nothing() -> None:
    bench = [
        records.AllreduceRow(n=2, bytes=b, iters=1, hvd_s=1e-4 + b / 1e9, mpi_s=1e-5 + b / 1e9)
        for b in (2**10, 2**20)
    ]
    # 10 ms exposed where the benchmark's allreduce of the gradients takes 1.1 ms: f = 9.1
    a = analyze_runs("strong", [_run(1, 100, 64), _run(2, 60, 32, comm_ms=10)], [], bench).series[0]
    assert a.step_model is not None and not a.step_model.described and not a.predictions
    from hpctrain.analysis.report import markdown

    md = markdown(analyze_runs("strong", [_run(1, 100, 64), _run(2, 60, 32, comm_ms=10)], [], bench), [])
    assert "does not describe these measurements" in md and "9.09x the allreduce" in md
    assert "Prediction beyond" not in md


def _write_study(root: Path, kind: str, runs: list[records.RunSummary], broken: int = 0) -> Path:
    entries = []
    for i, r in enumerate(runs):
        n = r.world_size
        rep = sum(1 for earlier in runs[:i] if earlier.world_size == n)
        d = root / f"n{n}-r{rep}-{i}"
        records.write(d / records.SUMMARY, r)
        entries.append(records.StudyRun(d.name, n, rep, n, [], str(d)))
    for j in range(broken):
        entries.append(records.StudyRun(f"failed-{j}", 1, 0, 1, [], str(root / f"failed-{j}")))
    records.write(
        root / records.STUDY, records.new(records.StudyManifest, kind=kind, launcher="local", runs=entries)
    )
    return root


def test_missing_runs_are_listed_and_the_report_is_written(tmp_path: Path) -> None:
    study = _write_study(tmp_path / "s", "strong", [_run(1, 100, 64), _run(2, 60, 32)], broken=2)
    a = analyze_dir(study)
    assert len(a.points) == 2 and len(a.missing) == 2
    paths = write_report(a, study / "report")
    for key in ("csv", "markdown", "html", "throughput", "efficiency", "breakdown"):
        assert paths[key].exists() and paths[key].stat().st_size > 0, key
    # no model FLOPs and no allreduce benchmark: no MFU, bus bandwidth or roofline plot (not an
    # empty frame), in the directory, the Markdown or the HTML
    assert not {"mfu", "busbw", "roofline"} & set(paths)
    assert sorted(p.name for p in (study / "report").glob("*.png")) == [
        "breakdown.png",
        "efficiency.png",
        "throughput.png",
    ]
    html = paths["html"].read_text()
    assert html.count("data:image/png;base64,") == 3  # self-contained: every plot drawn
    assert "mfu" not in paths["markdown"].read_text()
    assert "failed-0" in paths["markdown"].read_text()
    # reported again from the same analysis: the plots are kept, not drawn again ...
    drawn = {k: paths[k].stat().st_mtime_ns for k in ("throughput", "breakdown")}
    again = write_report(analyze_dir(study), study / "report")
    assert {k: again[k].stat().st_mtime_ns for k in drawn} == drawn
    # ... and drawn again when what they show changed (a run that finished since)
    _write_study(tmp_path / "s", "strong", [_run(1, 100, 64), _run(2, 50, 32)], broken=2)
    changed = write_report(analyze_dir(study), study / "report")
    assert all(changed[k].stat().st_mtime_ns != t for k, t in drawn.items())


def test_no_speedup_is_reported_as_such_not_as_a_limit_below_one() -> None:
    # 2 ranks take longer per step than 1 for the same global batch: speedup 100/150 < 1
    a = analyze_runs("strong", [_run(1, 100, 64), _run(2, 150, 32, comm_ms=60)], [])
    assert a.points[1].speedup == pytest.approx(2 / 3)
    assert a.series[0].amdahl_serial_fraction == pytest.approx(
        2.0
    )  # (1/S - 1/N) / (1 - 1/N) = (1.5 - 0.5) / 0.5
    assert a.series[0].no_speedup
    from hpctrain.analysis.report import markdown

    md = markdown(a, [])
    assert "Amdahl's law does not describe these measurements" in md and "speedup limit 1/s" not in md
    good = analyze_runs("strong", [_run(1, 100, 64), _run(2, 60, 32)], [])
    assert not good.series[0].no_speedup and "speedup limit 1/s = 5.0x" in markdown(good, [])


def test_two_engines_are_two_series_each_with_its_own_baseline_and_allreduce_fit(tmp_path: Path) -> None:
    # Horovod: 100 ms at 1 rank, 60 ms at 2; DDP: 90 ms and 50 ms (global batch 64)
    runs = [
        _run(1, 100, 64),
        _run(1, 90, 64, engine="ddp"),
        _run(2, 60, 32, comm_ms=1),
        _run(2, 50, 32, comm_ms=1.5, engine="ddp"),
    ]
    # Horovod's allreduce: 100 us + 1 ns/B; torch.distributed's: 40 us + 2 ns/B, over a wire (MPI)
    # of 2 x 5 us + 1 ns/B (exact at n = 2)
    bench = [
        records.AllreduceRow(
            n=2, bytes=b, iters=1, hvd_s=1e-4 + b / 1e9, torch_s=4e-5 + 2 * b / 1e9, mpi_s=1e-5 + b / 1e9
        )
        for b in (2**10, 2**16, 2**20)
    ]
    a = analyze_runs("strong", runs, [], bench)
    hvd, ddp = a.series
    assert (hvd.engine, ddp.engine) == ("horovod", "ddp") and a.compares
    # each engine's speedup is against its own 1-rank run
    assert (hvd.points[1].speedup, ddp.points[1].speedup) == pytest.approx((100 / 60, 90 / 50))
    assert ddp.points[1].efficiency == pytest.approx(90 / 100)
    assert hvd.comm is not None and ddp.comm is not None
    assert (hvd.comm.latency_s, hvd.comm.beta_s_per_byte) == pytest.approx((9e-5, 1e-9))
    assert (ddp.comm.latency_s, ddp.comm.beta_s_per_byte) == pytest.approx((3e-5, 2e-9))
    # DDP's exposed share: 1.5 ms of an allreduce of 1 MB at n = 2 in two buckets (1 MiB first bucket:
    # 1e6 B < 1 MiB, so one): 30 + 10 us + 1e6 x 2 ns = 2.04 ms
    assert ddp.step_model is not None and ddp.step_model.exposed == pytest.approx(1.5e-3 / 2.04e-3)

    from hpctrain.analysis.report import markdown, model_lines, rows

    assert [(r[0], r[1]) for r in rows(a)] == [("horovod", "1"), ("horovod", "2"), ("ddp", "1"), ("ddp", "2")]
    assert [r[5] for r in rows(a)] == ["1.00", "1.67", "1.00", "1.80"]
    lines = model_lines(a)
    assert sum(x.startswith("horovod: ") for x in lines) == sum(x.startswith("ddp: ") for x in lines) == 5
    md = markdown(a, [])
    assert "| ddp | 4 |" in md and "| horovod | 4 |" in md  # predictions per engine


def test_an_engine_comparison_study_is_reported_with_both_series(tmp_path: Path) -> None:
    runs = [_run(1, 100, 64), _run(1, 90, 64, engine="ddp"), _run(2, 60, 32), _run(2, 50, 32, engine="ddp")]
    a = analyze_dir(_write_study(tmp_path / "s", "strong", runs))
    assert [s.engine for s in a.series] == ["horovod", "ddp"]
    paths = write_report(a, tmp_path / "s" / "report")
    csv_rows = paths["csv"].read_text().splitlines()
    assert csv_rows[0].startswith("series,ranks,reps,throughput_samples_per_s,") and len(csv_rows) == 5
    assert {line.split(",")[0] for line in csv_rows[1:]} == {"horovod", "ddp"}


def test_points_csv_reads_into_numeric_columns_one_per_quantity(tmp_path: Path) -> None:
    """pandas reads every column but the series' name as numbers, without parsing: shares and
    efficiencies as fractions, an interval's bounds in columns of their own, unknowns as NaN;
    the figures are the points' (hand-made: 100 samples/s at N=1, 60 at N=2 with 32 per rank)."""
    import pandas as pd

    runs = [_run(1, 100, 64), _run(2, 60, 32), _run(1, 90, 64, engine="ddp"), _run(2, 50, 32, engine="ddp")]
    a = analyze_dir(_write_study(tmp_path / "s", "strong", runs))
    df = pd.read_csv(write_report(a, tmp_path / "s" / "report")["csv"])
    assert not pd.api.types.is_numeric_dtype(df.dtypes["series"])
    assert all(pd.api.types.is_numeric_dtype(t) for c, t in df.dtypes.items() if c != "series"), df.dtypes
    assert len(set(df.columns)) == len(df.columns)
    row = df[(df.series == "horovod") & (df.ranks == 2)].iloc[0]
    p = next(p for s in a.series if s.label == "horovod" for p in s.points if p.n == 2)
    assert row.throughput_samples_per_s == pytest.approx(p.throughput)
    assert row.speedup == pytest.approx(p.speedup) and row.efficiency == pytest.approx(p.speedup / 2)
    assert row.step_ms == pytest.approx(1e3 * p.step_s) and row.comm_share == pytest.approx(p.comm_share)
    assert 0 < row.efficiency < 1  # a fraction, not a percentage
    assert math.isnan(row.efficiency_lo) and math.isnan(row.mfu)  # one repetition, no FLOPs: unknown


def test_a_pipeline_point_reports_its_bubble_against_theory_and_memory_per_stage() -> None:

    from hpctrain.analysis.metrics import pipeline_bubble
    from hpctrain.analysis.report import memory_lines, rows

    assert pipeline_bubble(2, 4) == pytest.approx(1 / 5) and pipeline_bubble(4, 1) == pytest.approx(3 / 4)
    # per schedule, p = 4, m = 8, v = 2: interleaved 3/(16 + 3); looped zero bubble 3/(48 + 3); ZB-V none
    assert pipeline_bubble(4, 8, "1f1b") == pytest.approx(3 / 11)
    assert pipeline_bubble(4, 8, "interleaved_1f1b", 2) == pytest.approx(3 / 19)
    assert pipeline_bubble(4, 8, "interleaved_zb", 2) == pytest.approx(3 / 51)
    assert pipeline_bubble(4, 8, "zbv", 2) == 0.0
    runs = [
        _stage_peaks(
            replace_summary(
                _run(2, 50, 32),
                stages=2,
                microbatches=4,
                bubble_s=0.010 + 0.002 * k,  # 10 and 12 ms of a 50 ms step
            ),
            (300 * 2**20, (400 + 100 * k) * 2**20),
        )
        for k in (0, 1)
    ]
    a = analyze_runs("strong", runs, [])
    [p] = a.points
    pipe = p.parts["pipeline"]
    assert pipe["bubble_share"] == pytest.approx(0.011 / 0.050) and pipe["bubble_theory"] == pytest.approx(
        0.2
    )
    assert p.peak_by_stage == pytest.approx((300 * 2**20, 450 * 2**20))
    [row] = rows(a)
    named = dict(zip(columns(a), row))
    # bubble, theory, peak MiB of the fullest stage
    assert [named[c] for c in ("bubble", "bubble theory", "peak MiB")] == ["22.0%", "20.0%", "450"]
    assert memory_lines(a) == ["horovod N=2: stage 0 300 MiB, stage 1 450 MiB"]
    # data parallelism has no bubble to compare: its runs hold no pipeline part, so no column
    plain = analyze_runs("strong", [_run(1, 100, 64)], [])
    assert "bubble" not in columns(plain) and len(columns(plain)) == len(rows(plain)[0])


def test_micro_batch_counts_are_series_of_their_own() -> None:

    from hpctrain.analysis.report import rows

    runs = [
        replace_summary(_run(n, step, 64 // n), stages=n, microbatches=m)
        for n, m, step in [(2, 4, 100), (2, 8, 90), (4, 4, 60), (4, 8, 50)]
    ]
    a = analyze_runs("strong", runs, [])
    assert [s.label for s in a.series] == ["horovod m=4", "horovod m=8"]
    assert [r[0] for r in rows(a)] == ["horovod m=4", "horovod m=4", "horovod m=8", "horovod m=8"]
    assert a.series[1].points[1].speedup == pytest.approx(90 / 50)  # against its own smallest scale


def test_widely_scattered_repetitions_are_reported_and_plotted(tmp_path: Path) -> None:
    """The repetitions of a loaded CI machine (1 rank: 3.0 and 73.7 ms per step; 2 ranks: 6.1 and
    10.5 ms), and ten repetitions where one is 100 times faster: the arithmetic mean then lies
    above the t interval of the log mean. Both are plotted as measured, with no error."""
    runs = [_run(1, 3.0, 32), _run(1, 73.7, 32), _run(2, 6.1, 16), _run(2, 10.5, 16)]
    p1, p2 = analyze_runs("strong", runs, []).points
    # E = S / N: mean throughputs (32/0.0061 + 32/0.0105)/2 over (32/0.003 + 32/0.0737)/2, halved
    x1, x2 = (32 / 0.003 + 32 / 0.0737) / 2, (32 / 0.0061 + 32 / 0.0105) / 2
    assert p2.efficiency == pytest.approx(x2 / x1 / 2) == pytest.approx(p2.speedup / 2)
    assert p2.efficiency_ci.lo <= p2.efficiency <= p2.efficiency_ci.hi
    study = _write_study(tmp_path / "a", "strong", runs)
    assert write_report(analyze_dir(study), study / "report")["efficiency"].stat().st_size > 0
    skewed = [_run(1, 100, 64)] + [_run(2, 50, 32)] * 9 + [_run(2, 0.5, 32)]
    p2 = analyze_runs("strong", skewed, []).points[1]
    assert p2.throughput > p2.throughput_ci.hi  # the case a mean-centred error bar cannot draw
    study = _write_study(tmp_path / "b", "strong", skewed)
    assert write_report(analyze_dir(study), study / "report")["throughput"].stat().st_size > 0


def test_a_copied_study_reads_its_own_runs_never_the_originals(tmp_path: Path) -> None:
    """cp -a of a study, then every summary.json deleted in the copy: the copy has no finished run
    (its manifest's absolute paths still name the original, which is untouched)."""
    import shutil

    study = _write_study(tmp_path / "s", "strong", [_run(1, 100, 64), _run(2, 60, 32)])
    copy = tmp_path / "copy"
    shutil.copytree(study, copy, symlinks=True)
    for summary in copy.glob(f"*/{records.SUMMARY}"):
        summary.unlink()
    a = analyze_dir(copy)
    assert not a.points and sorted(Path(m).name for m in a.missing) == ["n1-r0-0", "n2-r0-1"]
    assert len(analyze_dir(study).points) == 2


def test_a_run_with_zero_throughput_is_named_and_left_out_not_a_crash(tmp_path: Path) -> None:
    zero = replace_summary(_run(2, 60, 32), throughput_samples_per_s=0.0)
    study = _write_study(tmp_path / "s", "strong", [_run(1, 100, 64), zero, _run(2, 62, 32)])
    a = analyze_dir(study)
    assert [p.n for p in a.points] == [1, 2] and a.points[1].reps == 1
    [why] = a.corrupt
    assert "n2-r0-1/summary.json: throughput_samples_per_s is 0.0, not a finite positive number" in why
    write_report(a, study / "report")  # Karp-Flatt and the rest: no ZeroDivisionError


def test_the_summary_cache_never_serves_a_stale_number(tmp_path: Path) -> None:
    """Re-analysis reads one compact table (.summaries-cache.json), yet any change of a record is
    seen: an atomic rewrite, an edit in place of the same length, a damaged cache, a copy."""
    import json
    import shutil

    from hpctrain.analysis import summaries
    from hpctrain.bench.analyze import synthetic_study

    study = synthetic_study(tmp_path / "s", 16)
    first = analyze_dir(study)
    assert (study / summaries.CACHE).exists()
    victim = study / "n1-r0" / "summary.json"

    def n1_throughput() -> float:
        [p] = [p for p in analyze_dir(study).points if p.n == 1]
        return p.throughput

    before = n1_throughput()
    assert before == [p for p in first.points if p.n == 1][0].throughput  # the cache agrees
    data = json.loads(victim.read_text())
    data["throughput_samples_per_s"] *= 2  # an atomic rewrite: a new file in its place
    records.write_atomic(victim, json.dumps(data))
    doubled = n1_throughput()
    assert doubled > before
    text = victim.read_text()  # an edit in place keeping the length: only the change time moves
    old = repr(data["throughput_samples_per_s"])
    new = old[:-1] + ("1" if old[-1] != "1" else "2")
    with victim.open("r+") as f:
        f.write(text.replace(old, new, 1))
    assert n1_throughput() != doubled
    (study / summaries.CACHE).write_text('{"version": 1, "rows": {"n1-r0": 7}}')  # damaged
    assert n1_throughput() != doubled
    copy = tmp_path / "copy"
    shutil.copytree(study, copy, copy_function=shutil.copy2)  # the cache comes along
    (copy / "n1-r0" / "summary.json").unlink()
    assert [m.rsplit("/", 1)[-1] for m in analyze_dir(copy).missing] == ["n1-r0"]  # not the original's


def test_the_cache_keeps_the_ranks_the_analysis_reads() -> None:
    """Per stage the rank with the highest peak, and the rank holding the most state: the
    compact summary's peak_by_stage and largest state equal the full record's."""
    from hpctrain.analysis.summaries import compact

    full = synthetic_summary(4, 64, 0.1, 0.06, 0.02, 0.01, 1000)
    ranks = [
        replace_summary(
            r, stage=r.rank // 2, peak_memory_bytes=100 + 10 * ((r.rank * 3) % 4), param_bytes=r.rank % 3
        )
        for r in full.per_rank
    ]
    full = replace_summary(full, per_rank=ranks, stages=2)
    small = compact(full)
    assert len(small.per_rank) < len(full.per_rank)
    assert small.peak_by_stage == full.peak_by_stage
    assert max(r.state_bytes for r in small.per_rank) == max(r.state_bytes for r in full.per_rank)


def test_reading_only_the_kept_ranks_gives_the_compact_summary_and_names_damage(tmp_path: Path) -> None:
    """The first analysis types only the ranks it keeps (read_compact); what it gives must equal
    compact() of the whole typed record, and a damaged kept rank is still named."""
    import json

    from hpctrain.analysis.summaries import compact, read_compact

    full = synthetic_summary(8, 64, 0.1, 0.06, 0.02, 0.01, 1000)
    ranks = [
        replace_summary(
            r,
            stage=r.rank // 4,
            peak_memory_bytes=100 + 10 * ((r.rank * 3) % 8),
            param_bytes=(r.rank * 5) % 7,
            optimizer_bytes=r.rank % 2,
        )
        for r in full.per_rank
    ]
    full = replace_summary(full, per_rank=ranks, stages=2)
    path = tmp_path / "summary.json"
    records.write(path, full)
    small = read_compact(path)
    assert small == compact(records.read(path, records.RunSummary))
    # state 0 6 3 2 6 5 2 1: rank 1 (the first of the two 6s); peak per stage: rank 2 (160), rank 5 (170)
    assert [r.rank for r in small.per_rank] == [1, 2, 5]
    data = json.loads(path.read_text())
    for rank, field, bad in ((1, "param_bytes", "many"), (2, "host", 5)):  # before / after selection
        damaged = json.loads(json.dumps(data))
        damaged["per_rank"][rank][field] = bad
        path.write_text(json.dumps(damaged))
        with pytest.raises(
            records.RecordError, match=rf"summary.json: not a valid RunSummary record: .*{field}"
        ):
            read_compact(path)


def test_a_studys_mfu_is_the_mean_of_its_runs_and_absent_when_one_lacks_it() -> None:

    from hpctrain.analysis.report import rows

    runs = [replace_summary(_run(1, 100, 64), mfu=m) for m in (0.30, 0.40)]
    [p] = analyze_runs("strong", runs, []).series[0].points
    assert p.mfu == pytest.approx(0.35)
    a = analyze_runs("strong", runs, [])
    assert dict(zip(columns(a), rows(a)[0]))["MFU"] == "35.0%"
    older = analyze_runs("strong", [runs[0], _run(1, 100, 64)], [])  # a record from before MFU
    assert dict(zip(columns(older), rows(older)[0]))["MFU"] == "-"


def test_mfu_has_its_own_line_in_the_terminal_and_a_column_in_the_report(tmp_path: Path) -> None:

    from hpctrain.analysis.report import mfu_lines, terminal_table

    runs = [
        replace_summary(_run(n, 100, 64), mfu=0.25, peak_source="table: H100 SXM bf16 dense") for n in (1, 2)
    ]
    a = analyze_runs("strong", runs, [])
    assert mfu_lines(a) == [
        "MFU (model FLOPs utilisation, against table: H100 SXM bf16 dense): N=1 25.0%, N=2 25.0%"
    ]
    assert "MFU" not in [c.header for c in terminal_table(a).columns]
    md = write_report(a, tmp_path / "report")["markdown"].read_text()
    assert "MFU" in md.splitlines()[4].strip("| ").split(" | ")  # the scaling table's header
    assert "## Model FLOPs utilisation" in md
    assert (tmp_path / "report" / "mfu.png").stat().st_size > 0 and "![mfu](mfu.png)" in md
    # analysed again without the FLOPs (its runs' records replaced): the plot drawn before goes
    write_report(analyze_runs("strong", [_run(n, 100, 64) for n in (1, 2)], []), tmp_path / "report")
    assert not (tmp_path / "report" / "mfu.png").exists()


def test_the_bus_bandwidth_axis_labels_do_not_overlap() -> None:
    """1 KiB to 1 MiB once printed eleven labels into each other ("128 KiB512 KiB")."""
    import matplotlib.pyplot as plt

    from hpctrain.analysis.plots import _log

    fig, ax = plt.subplots(dpi=100, figsize=(6, 4))
    ax.plot([2.0**k for k in range(10, 21)], [1.0] * 11)
    _log(ax, "x", 2, "B")
    fig.tight_layout()
    fig.canvas.draw()
    boxes = [t.get_window_extent() for t in ax.get_xticklabels() if t.get_text() and t.get_visible()]
    plt.close(fig)
    assert 3 <= len(boxes) <= 6
    assert all(a.x1 < b.x0 for a, b in zip(boxes, boxes[1:])), [(b.x0, b.x1) for b in boxes]


def test_a_fit_that_determined_nothing_says_so_instead_of_nan_or_inf() -> None:
    """A study once printed `f = nan` and `1/β = inf GB/s`."""
    from hpctrain.analysis.report import _pm

    assert _pm(float("nan"), float("nan"), 1, ".2f") == "not determined"
    assert _pm(float("inf"), 0.0, 1e-9, ".2f") == "not determined"
    assert _pm(2.5e9, 1e8, 1e-9, ".2f") == "2.50 ± 0.10"
    assert _pm(0.25, float("nan"), 1, ".2f") == "0.25"


def test_repetitions_on_different_nodes_are_flagged_in_the_report(tmp_path: Path) -> None:
    """Every run records the hosts its ranks ran on; a point whose repetitions ran on different
    node sets is named with each set (its speedup mixes the nodes' differences with the scaling);
    points on the same nodes, and runs recorded before hosts were, are not."""
    n2 = ["n1", "n2"]
    runs = [
        replace_summary(_run(1, 100, 64), hosts=["n1"]),
        replace_summary(_run(1, 101, 64), hosts=["n1"]),
        replace_summary(_run(2, 60, 32), hosts=n2),
        replace_summary(_run(2, 61, 32), hosts=["n3", "n4"]),
        replace_summary(_run(2, 59, 32), hosts=n2),
        replace_summary(_run(2, 60, 32), hosts=[]),  # an older record: no hosts
    ]
    a = analyze_runs("strong", runs, [])
    assert a.placement == ["N=2: its 3 repetitions ran on 2 node sets: n1,n2 (2 run(s)); n3,n4 (1 run(s))"]
    assert analyze_runs("strong", runs[:3], []).placement == []
    md = write_report(a, tmp_path / "report")["markdown"].read_text()
    assert "Placement: allocations and nodes" in md and "n3,n4 (1 run(s))" in md


def test_the_report_names_the_allocations_a_study_ran_in_and_their_nodes() -> None:
    from hpctrain.analysis.analyze import allocation_lines

    runs = [
        replace_summary(_run(2, 10, 8), hosts=["n1", "n2"]),
        replace_summary(_run(1, 10, 8), hosts=["n2"]),
    ]
    assert allocation_lines(["9"], [replace_summary(runs[1], switches=["s0"])]) == [
        "every point ran as a job step of one allocation (job 9) on 1 node(s): n2 under switch(es) s0"
    ]
    assert allocation_lines([], runs) == []
    assert allocation_lines(["71"], runs) == [
        "every point ran as a job step of one allocation (job 71) on 2 node(s): n1, n2"
    ]
    assert allocation_lines(["71", "75"], runs) == [
        "the points ran as job steps of 2 allocations (jobs 71, 75: the study was resumed in a new one) "
        "on 2 node(s): n1, n2"
    ]


def test_the_reports_points_table_is_two_tables_narrow_enough_for_a_page(tmp_path: Path) -> None:
    """The documentation site cut a 17-column table at the page's edge: the scaling, then where
    the time goes, each starting with the series and N, every shown column in one of them."""
    from hpctrain.analysis.report import halves, shown

    a = analyze_runs("strong", [_run(1, 100, 64), _run(2, 60, 32, comm_ms=10)], [])
    (t1, c1, r1), (t2, c2, r2) = halves(a)
    assert c1[:2] == c2[:2] == ["series", "N"] and "speedup" in c1 and "comm" in c2
    assert sorted(set(c1) | set(c2)) == sorted(shown(a)[0]) and max(len(c1), len(c2)) <= 12
    assert [r[:2] for r in r1] == [r[:2] for r in r2] == [["horovod", "1"], ["horovod", "2"]]
    md = write_report(a, tmp_path / "r")["markdown"].read_text()
    assert f"## {t1}" in md and f"## {t2}" in md
    assert "| horovod | 2 | " + " | ".join(r2[1][2:]) + " |" in md
