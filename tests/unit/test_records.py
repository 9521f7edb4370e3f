"""The run-directory contract: every record type round-trips, and every corrupt, truncated,
foreign or newer file is a RecordError that names the file (and line) and what is wrong."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from hpctrain import records
from hpctrain.bench.analyze import synthetic_summary
from hpctrain.errors import RecordError, RecordMissing

STEP = records.StepRecord(
    step=3,
    rank=1,
    loss=2.5,
    lr=0.1,
    data_s=0.001,
    compute_s=0.01,
    comm_s=0.002,
    step_s=0.013,
    samples=32,
    samples_per_s=4923.0,
    timed=True,
)
SUMMARY = synthetic_summary(2, 64, 0.1, 0.08, 0.015, 0.005)
EXAMPLES: dict[str, Any] = {
    "summary": SUMMARY,
    "rank summary": SUMMARY.per_rank[0],
    "job": records.new(
        records.JobRef, launcher="local", job_id="12", world_size=2, pid=12, pid_start=99, host="h"
    ),
    "state": records.new(
        records.LocalState,
        state="FAILED",
        updated=1.0,
        started=0.5,
        exit_code=4,
        failure=records.Failure(1, "InjectedFailure: boom", "last line"),
    ),
    "sweep": records.new(
        records.SweepManifest,
        sweep_dir="/s",
        launcher="slurm",
        runs=[records.SweepRun(0, ["a=1"], "/s/0", "7_0", 0)],
        arrays=[records.ArrayRef("7", 1)],
    ),
    "study": records.new(
        records.StudyManifest,
        kind="strong",
        launcher="local",
        runs=[records.StudyRun("n1-r0", 1, 0, 1, ["study=strong"], "/st/n1-r0")],
    ),
    "allreduce": records.new(
        records.AllreduceResult,
        n=2,
        mpi_library="Open MPI v4.1.4",
        rows=[records.AllreduceRow(2, 1024, 100, 2e-3, 3e-5, 1e-3, 8e-4, 9e-4)],
    ),
    "plan": records.new(
        records.PlanRecord,
        launcher="local",
        run_dir="/r",
        world_size=2,
        nodes=1,
        ranks_per_node=2,
        batch=records.Batch(32, 64, 32),
        lr=0.05,
        env={"A": "b"},
    ),
    "error": records.ErrorRecord(rank=1, host="h", type="ValueError", message="m", traceback="tb", time=1.0),
}


def _write(tmp_path: Path, record: Any) -> Path:
    path = tmp_path / "record.json"
    records.write(path, record)
    return path


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_every_record_round_trips(tmp_path: Path, name: str) -> None:
    record = EXAMPLES[name]
    assert records.read(_write(tmp_path, record), type(record)) == record


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_every_truncation_is_a_clear_error(tmp_path: Path, name: str) -> None:
    record = EXAMPLES[name]
    path = _write(tmp_path, record)
    text = path.read_text()
    for cut in sorted({0, 1, len(text) // 3, len(text) // 2, len(text) - 3}):
        path.write_text(text[:cut])
        with pytest.raises(RecordError) as e:
            records.read(path, type(record))
        assert str(path) in str(e.value)
        assert ("empty" if cut == 0 else "not valid JSON") in str(e.value)


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_wrong_types_missing_fields_and_foreign_json_are_named(tmp_path: Path, name: str) -> None:
    record = EXAMPLES[name]
    data = dataclasses.asdict(record)
    first = next(iter(data))
    cases = [
        (dict(data, **{first: {"nested": "object"}}), first),  # a wrong type names the field
        ({k: v for k, v in data.items() if k != first}, f"{first}: missing"),
        (["a", "list"], "expected a JSON object"),
    ]
    for bad, expected in cases:
        path = tmp_path / "bad.json"
        path.write_text(json.dumps(bad))
        with pytest.raises(RecordError) as e:
            records.read(path, type(record))
        assert str(path) in str(e.value) and expected in str(e.value), str(e.value)


def test_nested_field_errors_carry_their_path(tmp_path: Path) -> None:
    data = dataclasses.asdict(SUMMARY)
    data["per_rank"][1]["wall_s"] = "fast"
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(data))
    with pytest.raises(RecordError, match=r"per_rank\[1\]\.wall_s: expected a number, found 'fast'"):
        records.read(path, records.RunSummary)


def test_newer_format_and_unknown_keys_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "job.json"
    data = dataclasses.asdict(EXAMPLES["job"])
    path.write_text(json.dumps(dict(data, format_version=99)))
    with pytest.raises(RecordError, match="format_version 99 is newer"):
        records.read(path, records.JobRef)
    path.write_text(json.dumps(dict(data, surprise=1)))
    with pytest.raises(RecordError, match="unknown key.*surprise"):
        records.read(path, records.JobRef)
    # plan.json keeps the launcher's own details beside the common fields
    plan = dataclasses.asdict(EXAMPLES["plan"])
    path.write_text(json.dumps(dict(plan, argv=["mpirun", "-np", "2"])))
    assert records.read(path, records.PlanRecord).world_size == 2


def test_a_missing_file_is_its_own_error(tmp_path: Path) -> None:
    with pytest.raises(RecordMissing, match="missing"):
        records.read(tmp_path / "nope.json", records.RunSummary)


def test_steps_file_names_the_bad_line_and_tolerates_a_partial_tail(tmp_path: Path) -> None:
    path = tmp_path / records.steps_file(1)
    good = records.step_line(STEP)
    path.write_text(good + good + good[:20])  # a rank killed mid-write
    assert records.read_steps(path) == [STEP, STEP]
    with pytest.raises(RecordError, match="line 3: not valid JSON"):
        records.read_steps(path, tolerate_partial_tail=False)
    path.write_text(good + '{"step": "three"}\n' + good)
    with pytest.raises(
        RecordError, match=r"steps-rank1.jsonl, line 2: not a valid step record: step: expected an integer"
    ):
        records.read_steps(path)
    path.write_text(good + "\n\n" + good)  # blank lines are allowed
    assert len(records.read_steps(path)) == 2


def test_error_files_that_cannot_be_read_are_skipped(tmp_path: Path) -> None:
    records.write(tmp_path / records.error_file(1), EXAMPLES["error"])
    (tmp_path / records.error_file(0)).write_text('{"rank": 0, "host"')  # died while writing
    assert records.first_error(tmp_path) == EXAMPLES["error"]


def test_a_peers_connection_reset_is_never_taken_for_the_cause(tmp_path: Path) -> None:
    """Rank 1 is killed (it writes nothing); rank 0's Gloo then fails with "Connection reset by
    peer". That error is the effect: the launcher's report of rank 1 must come first."""
    effect = records.ErrorRecord(
        rank=0,
        host="h",
        type="RuntimeError",
        message="[gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:37292: Connection reset by peer",
        traceback="tb",
        time=1.0,
    )
    records.write(tmp_path / records.error_file(0), effect)
    assert records.first_error(tmp_path, causes_only=True) is None
    assert records.first_error(tmp_path) == effect  # still the best word when nothing else is known
    cause = dataclasses.replace(EXAMPLES["error"], rank=2, time=5.0)  # written later, but a cause
    records.write(tmp_path / records.error_file(2), cause)
    assert records.first_error(tmp_path) == cause == records.first_error(tmp_path, causes_only=True)


def test_the_generated_reader_of_flat_records_agrees_with_the_general_one() -> None:
    """RankSummary is read by a reader generated from its fields (10,000 runs x their ranks);
    whatever it does not accept goes to the general path, which names the problem."""
    from hpctrain.records.typed import _flat_reader

    fast = _flat_reader(records.RankSummary)
    assert fast is not None and _flat_reader(records.RunSummary) is None  # RunSummary nests, is versioned
    good = records.to_dict(
        records.RankSummary(0, "h", 3, 1.0, 0.1, 0.1, 0.2, 0.0, 0.05, 0.02, 2.0, 1.0, 10, 5)
    )
    assert fast(good) == records.from_dict(records.RankSummary, good)
    for bad in (
        {**good, "rank": "0"},
        {**good, "rank": True},
        {**good, "extra": 1},
        {k: v for k, v in good.items() if k != "host"},
    ):
        assert fast(bad) is None
        with pytest.raises(RecordError):
            records.from_dict(records.RankSummary, bad)
    as_int = {**good, "wall_s": 1}  # an int where a float goes: converted by the general path
    assert fast(as_int) is None and records.from_dict(records.RankSummary, as_int).wall_s == 1.0


def test_numbers_that_are_not_finite_are_written_as_standard_json_and_read_back_as_nan(
    tmp_path: Path,
) -> None:
    """A zero throughput once wrote `"throughput_samples_per_s": NaN` into summary.json, which
    readers that follow the JSON standard refuse."""
    import math

    def strict(text: str) -> object:
        def refuse(token: str) -> object:
            raise ValueError(f"not JSON: {token}")

        return json.loads(text, parse_constant=refuse)

    rank = records.RankSummary(0, "h", 3, 1.0, 0.1, 0.1, 0.2, 0.0, 0.05, 0.02, math.nan, math.inf, 10, 5)
    records.write(tmp_path / "r.json", rank)
    written = strict((tmp_path / "r.json").read_text())
    assert (written["first_loss"], written["last_loss"], written["wait_s"]) == (None, None, None)  # type: ignore[index]
    back = records.read(tmp_path / "r.json", records.RankSummary)
    assert math.isnan(back.first_loss) and math.isnan(back.wait_s) and back.step_s == 0.1
    records.write_json(tmp_path / "d.json", {"a": [1.0, math.nan], "b": {"c": -math.inf}})
    assert strict((tmp_path / "d.json").read_text()) == {"a": [1.0, None], "b": {"c": None}}
    line = records.step_line(records.StepRecord(0, 0, math.nan, 0.1, 0.0, 0.1, 0.0, 0.0, 4, 40.0, True))
    assert strict(line)["loss"] is None  # type: ignore[index]
