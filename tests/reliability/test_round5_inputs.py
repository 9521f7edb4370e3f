"""Round 5, classes 1 and 7: nothing a user or a run directory hands hpctrain is read without a
bound, and a malformed input is a usage error (exit 2 or a named record), never "a bug in
hpctrain". Each case ran out of memory, ran for minutes or printed an unexpected exception before."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpctrain import bounded, facts, records
from hpctrain.errors import RecordError
from tests.conftest import ROOT, hpctrain_here
from tests.unit.test_records import STEP


def _cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """In a process of its own, so that a read without a bound fails the test by its time limit
    instead of taking the test runner's memory with it."""
    return subprocess.run(
        [sys.executable, "-m", "hpctrain.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


def test_an_overrides_file_of_dev_zero_is_refused_at_once() -> None:
    r = _cli("run", "--dry-run", "--overrides-file", "/dev/zero")
    assert r.returncode == 2
    assert "/dev/zero: cannot be read (holds more than the 1 MiB hpctrain reads from such a file)" in r.stderr


def test_an_overrides_file_of_two_million_lines_is_refused_at_once(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_text("".join(f"- train.seed={i}\n" for i in range(2_000_000)))
    r = _cli("run", "--dry-run", "--overrides-file", str(big))
    assert r.returncode == 2 and "holds more than the 1 MiB" in r.stderr


def test_an_overrides_file_that_is_a_fifo_is_refused_not_waited_on(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    r = _cli("run", "--dry-run", "--overrides-file", str(fifo), timeout=30)
    assert r.returncode == 2 and "is not a regular file" in r.stderr


@pytest.mark.parametrize(
    "content, said",
    [
        (b"- train.seed=\xff\xfe\n", "is not UTF-8 text (byte 13: invalid start byte)"),
        (b"[" * 100_000 + b"]" * 100_000, "nests deeper than Python can read"),
        ("".join(f"- train.seed={i}\n" for i in range(10_001)).encode(), "holds 10001 overrides"),
    ],
)
def test_a_malformed_overrides_file_is_a_usage_error(tmp_path: Path, content: bytes, said: str) -> None:
    f = tmp_path / "o.yaml"
    f.write_bytes(content)
    r = hpctrain_here("run", "--dry-run", "--overrides-file", str(f))
    assert r.returncode == 2 and said in r.stderr and "bug" not in r.stderr, r.stderr


def test_an_override_nested_thousands_deep_is_a_usage_error() -> None:
    deep = "train.seed=" + "[" * 3000 + "]" * 3000
    for args in (["run", "--dry-run", deep], ["run", "-m", "--dry-run", deep]):
        r = hpctrain_here(*args)
        assert r.returncode == 2 and "nests lists or maps 3000 levels deep" in r.stderr, r.stderr


def test_records_past_their_bound_are_named_not_read(tmp_path: Path) -> None:
    """A sparse 300 MiB summary.json (no disk used) and a step file of one endless line."""
    run = tmp_path / "run"
    run.mkdir()
    with open(run / records.SUMMARY, "wb") as f:
        f.truncate(300 * bounded.MiB)
    with pytest.raises(RecordError, match=r"summary.json: cannot be read \(.*holds more than the 256 MiB"):
        records.read_json(run / records.SUMMARY)
    steps = run / records.steps_file(0)
    with open(steps, "wb") as f:
        f.write(b'{"step": ' + b"1" * (2 * records.MAX_LINE))
        f.write(b"\n")
    with pytest.raises(RecordError, match="line 1: longer than 1048576 bytes"):
        list(records.iter_steps(steps))
    (run / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(RecordError, match="nests deeper than a record does"):
        records.read_json(run / "deep.json")


def test_step_records_still_read_line_by_line_with_a_partial_tail(tmp_path: Path) -> None:
    f = tmp_path / "steps-rank0.jsonl"
    line = records.step_line(STEP)
    f.write_text(line + line + line[: len(line) // 2])
    assert [s.step for s in records.iter_steps(f)] == [STEP.step, STEP.step]
    with pytest.raises(RecordError, match="line 3"):
        list(records.iter_steps(f, tolerate_partial_tail=False))


def test_a_planted_giant_cache_entry_is_no_entry(tmp_path: Path) -> None:
    entry = tmp_path / "peak.json"
    entry.write_text(json.dumps({"tflops": 1.0, "pad": "x" * (2 * bounded.MiB)}))
    assert facts.read_cached(entry) is None
    entry.write_text(json.dumps({"tflops": 1.0}))
    assert facts.read_cached(entry) == {"tflops": 1.0}


def test_threads_per_rank_past_the_cores_is_refused_as_ranks_are() -> None:
    """It becomes OMP_NUM_THREADS: 100,000 a rank was accepted (round 5, class 3)."""
    r = hpctrain_here("run", "--dry-run", "cluster.threads_per_rank=100000")
    assert r.returncode == 2 and "cluster.threads_per_rank: 100000 threads x 2 ranks on" in r.stderr, r.stderr
    ok = hpctrain_here("run", "--dry-run", "cluster.threads_per_rank=100000", "cluster.oversubscribe=true")
    assert ok.returncode == 0, ok.stderr


@pytest.mark.parametrize(
    "overrides, said",
    [  # class 9: settings nothing would read are refused, as other unused settings are
        (
            ["cluster.preflight.tolerance=0.3"],
            "cluster.preflight.tolerance: is read by the pre-flight check, which is off",
        ),
        (["debug.slow_node=n2", "debug.slow_s=1"], "debug.slow_node: 'n2' is not a node of this run"),
        (
            ["parallelism.engine=ddp", "cluster.starter=spawn", '+cluster.env={RANK: "5", WORLD_SIZE: "9"}'],
            "cluster.env.RANK: says who a rank is, which the launcher sets for each rank",
        ),
        (
            ["cluster.starter=spawn", "script={tmp}/ok.py"],
            "cluster.starter: spawn starts the ranks without MPI, and "
            "parallelism.backend=mpi starts a script's ranks under MPI",
        ),
        # class 8: found before anything is created, not on the ranks
        (['+cluster.env={MASTER_PORT: "notaport"}'], "cluster.env.MASTER_PORT: 'notaport' is not a TCP port"),
    ],
)
def test_settings_that_would_be_ignored_or_fail_late_are_refused_first(
    tmp_path: Path, overrides: list[str], said: str
) -> None:
    (tmp_path / "ok.py").write_text("print('ok')\n")
    args = [o.replace("{tmp}", str(tmp_path)) for o in overrides]
    r = hpctrain_here("run", "--dry-run", f"run.dir={tmp_path / 'run'}", *args)
    assert r.returncode == 2 and said in r.stderr, r.stderr
    assert not (tmp_path / "run").exists()


def test_a_group_chosen_twice_is_said_not_silently_dropped() -> None:
    """Round 5, class 9: `model=mlp model=cnn` took cnn without a word. Said, not refused: scripts
    build command lines from a base and a variant (the suite's own do)."""
    r = hpctrain_here("run", "--cfg", "model=mlp", "model=cnn")
    assert r.returncode == 0 and "name: cnn" in r.stdout
    said = "hpctrain: note: model is chosen twice on the command line (model=mlp, then model=cnn): model=cnn counts"
    assert said in r.stderr, r.stderr
    once = hpctrain_here("run", "--cfg", "model=mlp", "train.steps=5", "train.steps=9")
    assert "note" not in once.stderr  # a key set twice is Hydra's last-wins, as scripts expect
