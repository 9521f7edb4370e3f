"""Tracking, profiling and cost on real mpirun runs: a 4-rank Horovod run is one MLflow run and one
TensorBoard writer with a tag per rank, its profiler writes one trace per rank whose summary
agrees with the step records of the same steps, and its summary carries node-hours; a DDP run
whose tracking server is down trains to the end, warns, and its traces agree too."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from hpctrain import records
from hpctrain.analysis.traces import agreement
from hpctrain.commands.traces import load_traces
from tests.conftest import MLP, hpctrain, hpctrain_here, run_ok

pytestmark = pytest.mark.mpi

# The trace's phases and the step records time the same moments with two clocks (the profiler's
# and perf_counter); what separates them is the code and the profiler's bookkeeping between a
# phase's mark and the record's clock read, and a busy 2-core machine preempting a rank right
# there: on a quiet machine they agree within 1% of a step. A preemption is one run's accident
# and a real disagreement (a phase measured from the wrong mark) is in every run, so a run that
# disagrees is run once more: both must disagree to fail, and the message gives both figures.
TOLERANCE = 0.15
OBSERVED = [*MLP, "train.steps=10", "profile.enabled=true"]


def _worst(run_dir: Path, ranks: int) -> float:
    """The largest disagreement of any rank's profiled steps, as a share of its step."""
    traces = load_traces(run_dir)
    assert [t.rank for t in traces] == list(range(ranks))
    worst = 0.0
    for t in traces:
        assert [s.step for s in t.steps] == [2, 3, 4]  # the default window: 3 steps after warm-up
        a = agreement(t, records.read_steps(run_dir / records.steps_file(t.rank)))
        assert a is not None and a.steps == 3
        worst = max(worst, a.worst())
    return worst


def assert_traces_agree(run_dir: Path, ranks: int, again: Callable[[], Path]) -> None:
    """The traces of `run_dir` agree with its records, or those of the same run made `again` do."""
    first = _worst(run_dir, ranks)
    if first <= TOLERANCE:
        return
    second = _worst(again(), ranks)
    assert second <= TOLERANCE, (
        f"trace and records disagree by {first:.1%} of a step, and by {second:.1%} in the same run "
        f"again (tolerance {TOLERANCE:.0%}): a disagreement in every run, not a preemption"
    )


def test_a_four_rank_run_is_tracked_once_profiled_per_rank_and_costed(tmp_path: Path) -> None:
    run_dir, uri = tmp_path / "run", f"sqlite:///{tmp_path / 'mlflow.db'}"
    r = hpctrain(
        "run",
        "--no-progress",
        f"run.dir={run_dir}",
        *OBSERVED,
        "cluster.ranks=4",
        "profile.horovod_timeline=true",
        "tracking=both",
        f"tracking.uri={uri}",
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"tensorboard --logdir {run_dir / 'tensorboard'}" in r.stdout
    assert "USDT:" not in r.stdout + r.stderr  # the profiler's stage markers stay in the logs
    assert "USDT:" in (run_dir / "logs" / "rank0.log").read_text()
    assert "cost (allocation x training)" in r.stdout and "not measured" in r.stdout
    client = MlflowClient(uri)
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert run.info.status == "FINISHED" and run.data.params["hpctrain.world_size"] == "4"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "loss")] == list(range(10))
    ea = EventAccumulator(str(run_dir / "tensorboard"))
    ea.Reload()
    assert {t for t in ea.Tags()["scalars"] if t.startswith("comm_ms/")} == {
        f"comm_ms/rank{k}" for k in range(4)
    }
    assert_traces_agree(run_dir, 4, lambda: run_ok(tmp_path, "again", *OBSERVED, "cluster.ranks=4")[0])
    timeline = (run_dir / "traces" / "horovod_timeline.json").read_text()  # Horovod's own, rank 0 writes it
    assert '"ph"' in timeline and "ALLREDUCE" in timeline.upper()
    shown = hpctrain_here("analyze", str(run_dir))
    assert shown.returncode == 0 and "straggler: rank" in shown.stdout, shown.stdout + shown.stderr
    s = json.loads((run_dir / records.SUMMARY).read_text())
    assert s["nodes"] == 1 and s["cost_source"] == "allocation" and s["energy_j"] is None
    assert s["node_hours"] == pytest.approx((s["finished"] - s["started"]) / 3600)
    assert s["core_hours"] == pytest.approx(4 * s["threads_per_rank"] * s["node_hours"])


def test_a_ddp_run_whose_tracking_server_is_down_trains_to_the_end(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    r = hpctrain(
        "run",
        "--no-progress",
        f"run.dir={run_dir}",
        *OBSERVED,
        "parallelism.engine=ddp",
        "tracking=mlflow",
        "tracking.uri=http://127.0.0.1:9",  # nothing listens
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "warning: tracking stopped" in r.stdout and f"hpctrain track {run_dir}" in r.stdout
    assert "Traceback" not in r.stdout + r.stderr
    assert len(records.read_steps(run_dir / records.steps_file(1))) == 10
    assert_traces_agree(run_dir, 2, lambda: run_ok(tmp_path, "again", *OBSERVED, "parallelism.engine=ddp")[0])


def test_the_profile_settings_change_what_the_trace_holds(tmp_path: Path) -> None:
    """profile.ranks picks the ranks that write a trace; record_shapes adds operators' input
    shapes, with_stack their Python call stacks, memory the allocator's events. One run with all
    of them against the run above's defaults (none of them)."""
    import json as _json

    run_dir = tmp_path / "all"
    r = hpctrain(
        "run", "--no-progress", f"run.dir={run_dir}", *OBSERVED, "cluster.ranks=2", "profile.ranks=[1]",
        "profile.record_shapes=true", "profile.with_stack=true", "profile.memory=true",
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(p.name for p in (run_dir / "traces").iterdir()) == ["rank1.pt.trace.json"]
    events = _json.loads((run_dir / "traces" / "rank1.pt.trace.json").read_text())["traceEvents"]
    ops = [e for e in events if e.get("cat") == "cpu_op"]
    assert any("Input Dims" in e.get("args", {}) for e in ops)  # record_shapes
    assert any(e.get("cat") == "python_function" for e in events)  # with_stack
    assert any(e.get("name") == "[memory]" for e in events)  # memory
    plain = tmp_path / "plain"
    r = hpctrain("run", "--no-progress", f"run.dir={plain}", *OBSERVED, "cluster.ranks=2")
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(p.name for p in (plain / "traces").iterdir()) == [
        "rank0.pt.trace.json",
        "rank1.pt.trace.json",
    ]
    events = _json.loads((plain / "traces" / "rank1.pt.trace.json").read_text())["traceEvents"]
    assert not any("Input Dims" in e.get("args", {}) for e in events if e.get("cat") == "cpu_op")
    assert not any(e.get("cat") == "python_function" for e in events)
    assert not any(e.get("name") == "[memory]" for e in events)
