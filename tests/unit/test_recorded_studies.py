"""The step model on studies recorded on this machine (tests/fixtures/studies: summaries,
manifest and allreduce benchmark, copied from `hpctrain study` runs):

- local-strong: `hpctrain study strong study.ranks=[1,2] study.repetitions=3` (mpirun);
- local-strong-waits: the same study, recorded after the ranks began to measure the wait for the
  slowest rank (the two older ones predate it: their records have no wait, as old records do);
- slurm-weak: `hpctrain study weak cluster=slurm cluster.ranks_per_node=1 study.nodes=[1,2,4]
  study.repetitions=3` on the local SLURM cluster (one of the 4-node runs died at start-up).

Both machines are 2 shared cores: the model must either predict each held-out scale within 15%
or say which term carries the error and why, and refuse to predict what it does not describe."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpctrain.analysis.analyze import analyze_dir
from hpctrain.analysis.report import markdown
from hpctrain.bench.predict import TARGET

STUDIES = Path(__file__).parents[1] / "fixtures" / "studies"


@pytest.mark.parametrize("name", ["local-strong", "local-strong-waits", "slurm-weak"])
def test_every_held_out_scale_is_predicted_within_the_target_or_its_error_is_explained(name: str) -> None:
    a = analyze_dir(STUDIES / name)
    [s] = a.series
    assert s.step_model is not None
    for c in s.step_model.checks:
        if c.held_out is None:
            assert c.scale.n > 1 and c.why  # only a multi-rank scale lacks others to fit the overlap
        elif abs(c.loo_err) > TARGET:
            assert c.term in ("compute", "communication", "data wait", "bubble") and c.why
    md = markdown(a, [])
    assert "leave-one-out N=1:" in md and "LOO err" in md


def test_the_local_study_blames_threads_for_the_one_rank_error_and_refuses_to_predict() -> None:
    a = analyze_dir(STUDIES / "local-strong")
    [s] = a.series
    m = s.step_model
    assert m is not None and [p.reps for p in s.points] == [3, 3]
    one = m.checks[0]
    # 1 rank ran 2 threads, 2 ranks 1 thread each: compute per sample does not carry over
    assert one.term == "compute" and "with 1 thread(s) per rank; N=1 ran 2" in one.why
    assert one.loo_err > TARGET
    # exposed communication 1.33x the benchmark's allreduce of the gradients: not described
    assert not m.described and m.exposed_raw == pytest.approx(1.33, abs=0.01) and not s.predictions
    # 3 repetitions: t intervals in log space, positive whatever the spread
    assert all(p.throughput_ci.method.startswith("95% CI") and p.throughput_ci.lo > 0 for p in s.points)


def test_the_wait_for_the_slowest_rank_explains_exposed_communication_beyond_the_allreduce() -> None:
    a = analyze_dir(STUDIES / "local-strong-waits")
    [s] = a.series
    m, two = s.step_model, s.points[1]
    assert m is not None and two.n == 2 and two.imbalance_s > 0
    expected = m.expected_comm_s(2)
    # all of the exposed time against the allreduce would be a share far above 1 ...
    assert two.comm_s / expected > 1.3
    # ... but two thirds of it is waiting for the slower rank; the rest is a physical share
    assert two.imbalance_s > 0.5 * two.comm_s
    assert m.described and 0 < m.exposed_raw < 1 and m.exposed_se > 0 and m.exposed == m.exposed_raw
    roof = two.roofline
    assert roof is not None and roof.wait_s == pytest.approx(two.imbalance_s) and roof.imbalanced
    # described, so it predicts: 2x, 4x, 8x the largest scale, banded by the leave-one-out error
    assert [q.n for q in s.predictions] == [4, 8, 16] and all(q.throughput > 0 for q in s.predictions)
    assert all(q.band == m.loo_band and q.band > TARGET for q in s.predictions)
    assert m.checks[0].term == "compute"  # 2 threads at N=1, 1 at N=2: that error is explained


def test_the_slurm_study_lists_its_failed_run_and_sees_ranks_waiting_not_transferring() -> None:
    a = analyze_dir(STUDIES / "slurm-weak")
    [s] = a.series
    assert [p.n for p in s.points] == [1, 2, 4] and [p.reps for p in s.points] == [3, 3, 2]
    assert [Path(m).name for m in a.missing] == ["n4-r0"]
    assert s.points[2].throughput_ci.method.startswith("min–max")  # 2 repetitions left
    m = s.step_model
    assert m is not None and not m.described and not s.predictions
    # 4 "nodes" on 2 cores: the 4-rank steps wait far longer than the allreduce takes
    roof = s.points[2].roofline
    assert roof is not None and roof.waits and "slower rank or ranks sharing cores" in roof.knob


def test_bench_predict_prints_both_errors_for_recorded_studies() -> None:
    import io

    from rich.console import Console

    from hpctrain.bench.predict import run_predict
    from hpctrain.cli import build_parser

    out = io.StringIO()
    args = build_parser().parse_args(
        [
            "bench",
            "predict",
            *(str(STUDIES / n) for n in ("local-strong", "slurm-weak", "local-strong-waits")),
        ]
    )
    assert run_predict(args, Console(file=out, width=200)) == 0
    text = out.getvalue()
    assert text.count("largest error: in-sample") == 3 and "leave-one-out" in text
    assert "the model describes these runs" in text
    assert "does NOT describe these runs" in text and "LOO err" in text
    # the published results come first, each with its largest error beyond the fitted scales
    assert text.index("bench predict: Piz Daint") < text.index("largest error: in-sample")
    assert (
        "fitted up to 16 GPUs; largest error beyond: 39.4%; what the model lacks there: parameter servers"
        in text
    )
    assert "fitted up to 16 GPUs; largest error beyond: 8.3%\n" in text


def test_status_of_a_study_lists_every_run_also_those_without_a_job(tmp_path: Path) -> None:
    """Before, a run whose directory was a file (analyze names it) or that never started was left
    out of status."""
    import shutil

    from tests.conftest import hpctrain_here

    study = tmp_path / "strong"
    shutil.copytree(Path(__file__).parents[1] / "fixtures" / "studies" / "local-strong", study)
    shutil.rmtree(study / "n2-r2")
    (study / "n2-r2").write_text("not a run")
    shutil.rmtree(study / "n2-r1")
    r = hpctrain_here("status", str(study))
    assert r.returncode == 0, r.stderr
    assert "2 runs: 2 not started" in r.stdout, r.stdout
    rows = {line.split("│")[1].strip(): line for line in r.stdout.splitlines() if line.count("│") > 3}
    assert "NOT STARTED" in rows["n2-r1"] and "not started yet" in rows["n2-r1"], r.stdout
    assert "NOT STARTED" in rows["n2-r2"] and "n2-r2 is not a directory" in rows["n2-r2"], r.stdout
