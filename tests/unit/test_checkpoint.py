"""Checkpoints survive a crash mid-write: `latest` always names a complete checkpoint."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hpctrain.train import checkpoint


def _state(value: float):
    model = torch.nn.Linear(4, 2)
    with torch.no_grad():
        model.weight.fill_(value)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return model, opt


def test_save_and_load_round_trip(tmp_path: Path) -> None:
    model, opt = _state(1.5)
    checkpoint.save(tmp_path, 7, model, opt, None)
    fresh, fresh_opt = _state(0.0)
    assert checkpoint.load(checkpoint.latest(tmp_path), fresh, fresh_opt, None) == 7
    assert torch.equal(fresh.weight, model.weight)


def test_only_the_newest_two_are_kept(tmp_path: Path) -> None:
    model, opt = _state(1.0)
    for step in (10, 20, 30):
        checkpoint.save(tmp_path, step, model, opt, None)
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("step-*.pt")) == [
        "step-000020.pt",
        "step-000030.pt",
    ]


def test_failure_while_writing_keeps_the_previous_checkpoint(tmp_path: Path, monkeypatch) -> None:
    model, opt = _state(1.0)
    checkpoint.save(tmp_path, 10, model, opt, None)

    def crash(fd: int) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", crash)
    with pytest.raises(OSError):
        checkpoint.save(tmp_path, 20, *_state(9.0), None)
    monkeypatch.undo()
    assert checkpoint.latest(tmp_path).name == "step-000010.pt"
    fresh, fresh_opt = _state(0.0)
    assert checkpoint.load(checkpoint.latest(tmp_path), fresh, fresh_opt, None) == 10
    assert not list((tmp_path / "checkpoints").glob(".step-000020*"))  # no half-written file left


# checkpoint.save renames the step file into place, then the `latest` pointer; a SIGKILL at each
# moment, through the real save path in a real process: (which rename dies, what latest names then)
CRASHES = [
    ("the step file's rename", 1, "step-000010.pt"),  # nothing of step 20 is visible
    ("the pointer's rename", 2, "step-000010.pt"),  # step 20 is complete but not yet named
    ("the old checkpoints' cleanup", 3, "step-000020.pt"),  # named: a resume uses it
]


@pytest.mark.parametrize("moment,kill_at,expected", CRASHES, ids=[c[0] for c in CRASHES])
def test_a_kill_during_save_leaves_latest_naming_a_complete_checkpoint(
    tmp_path: Path, moment: str, kill_at: int, expected: str
) -> None:
    model, opt = _state(1.0)
    for step in (5, 10):
        checkpoint.save(tmp_path, step, model, opt, None)
    code = f"""
import os, signal, torch
from pathlib import Path
from hpctrain.train import checkpoint
calls = 0
def counted(real):
    def wrapper(*args, **kwargs):
        global calls
        calls += 1
        if calls == {kill_at}:
            os.kill(os.getpid(), signal.SIGKILL)
        return real(*args, **kwargs)
    return wrapper
os.replace = counted(os.replace)  # calls 1 and 2: the step file, then the pointer
Path.unlink = counted(Path.unlink)  # call 3: removing the oldest checkpoint
model = torch.nn.Linear(4, 2)
with torch.no_grad():
    model.weight.fill_(9.0)
checkpoint.save(Path({str(tmp_path)!r}), 20, model, torch.optim.SGD(model.parameters(), lr=0.1), None)
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == -9, r.stderr  # it really died mid-save
    latest = checkpoint.latest(tmp_path)
    assert latest is not None and latest.name == expected
    fresh, fresh_opt = _state(0.0)
    step = checkpoint.load(latest, fresh, fresh_opt, None)
    assert step == int(expected[5:11])
    assert float(fresh.weight.detach()[0, 0]) == (9.0 if step == 20 else 1.0)
    # the next save works, becomes the latest, and removes what the killed save left half-written
    checkpoint.save(tmp_path, 30, *_state(3.0), None)
    assert checkpoint.latest(tmp_path).name == "step-000030.pt"
    assert not list((tmp_path / "checkpoints").glob(".*"))


def test_read_new_lines_returns_only_complete_lines(tmp_path: Path) -> None:
    from hpctrain.records import read_new_lines

    log = tmp_path / "log"
    assert read_new_lines(log, 0) == ([], 0)  # not there yet
    log.write_bytes(b"one\ntwo\nthr")
    lines, off = read_new_lines(log, 0)
    assert lines == ["one", "two"] and off == 8
    with open(log, "ab") as f:
        f.write("ee – ü\n".encode())
    lines, off2 = read_new_lines(log, off)
    assert lines == ["three – ü"] and off2 == log.stat().st_size


# --- restore: never a silent restart from step 0 over an earlier attempt ---------------------
def _two_checkpoints(tmp_path: Path) -> None:
    checkpoint.save(tmp_path, 10, *_state(1.0), None)
    checkpoint.save(tmp_path, 20, *_state(2.0), None)


def _restore(tmp_path: Path) -> tuple[checkpoint.Restored, float]:
    fresh, fresh_opt = _state(0.0)
    r = checkpoint.restore(tmp_path, fresh, fresh_opt, None)
    return r, float(fresh.weight.detach()[0, 0])


def test_restore_uses_the_checkpoint_latest_names(tmp_path: Path) -> None:
    _two_checkpoints(tmp_path)
    r, w = _restore(tmp_path)
    assert (r.step, r.path.name, r.skipped, w) == (20, "step-000020.pt", [], 2.0)


def test_a_pointer_to_a_missing_file_falls_back_to_the_newest_checkpoint(tmp_path: Path) -> None:
    _two_checkpoints(tmp_path)
    (tmp_path / "checkpoints" / "latest").write_text("step-000099.pt\n")
    r, w = _restore(tmp_path)
    assert (r.step, w) == (20, 2.0)
    assert r.skipped == [f"{tmp_path}/checkpoints/latest names 'step-000099.pt', which does not exist"]


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty", "foreign"])
def test_a_damaged_newest_checkpoint_falls_back_to_the_one_before(tmp_path: Path, damage: str) -> None:
    _two_checkpoints(tmp_path)
    newest = tmp_path / "checkpoints" / "step-000020.pt"
    data = newest.read_bytes()
    if damage == "foreign":
        torch.save({"weights": 1}, newest)
    else:
        newest.write_bytes(
            {"truncated": data[: len(data) // 2], "garbage": os.urandom(len(data)), "empty": b""}[damage]
        )
    r, w = _restore(tmp_path)
    assert (r.step, r.path.name, w) == (10, "step-000010.pt", 1.0)
    assert len(r.skipped) == 1 and r.skipped[0].startswith("step-000020.pt is unusable ("), r.skipped


def test_a_missing_pointer_uses_the_newest_complete_checkpoint(tmp_path: Path) -> None:
    _two_checkpoints(tmp_path)
    (tmp_path / "checkpoints" / "latest").unlink()  # killed between the step file and the pointer
    r, w = _restore(tmp_path)
    assert (r.step, w, r.skipped) == (20, 2.0, [])


def test_no_usable_checkpoint_is_an_error_naming_every_file(tmp_path: Path) -> None:
    _two_checkpoints(tmp_path)
    for p in (tmp_path / "checkpoints").glob("step-*.pt"):
        p.write_bytes(b"\0" * 10)
    with pytest.raises(checkpoint.CheckpointError) as e:
        _restore(tmp_path)
    msg = str(e.value)
    assert "step-000020.pt is unusable" in msg and "step-000010.pt is unusable" in msg
    assert "remove the checkpoints directory" in msg


def test_a_pointer_with_no_checkpoint_at_all_is_an_error_not_a_fresh_start(tmp_path: Path) -> None:
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "latest").write_text("step-000040.pt\n")
    with pytest.raises(checkpoint.CheckpointError, match="names 'step-000040.pt', which does not exist"):
        _restore(tmp_path)


def test_no_checkpoint_is_a_fresh_start(tmp_path: Path) -> None:
    r, w = _restore(tmp_path)
    assert (r.step, r.path, r.skipped, w) == (0, None, [], 0.0)


def test_a_restart_keeps_the_earlier_attempts_records_it_drops(tmp_path: Path) -> None:
    from hpctrain import records

    path = tmp_path / "steps-rank0.jsonl"
    rec = dict(
        rank=0, loss=1.0, lr=0.1, data_s=0, compute_s=0, comm_s=0, step_s=1, samples=1, samples_per_s=1
    )
    text = "".join(records.step_line(records.StepRecord(step=s, timed=True, **rec)) for s in range(8))
    path.write_text(text + '{"step": 8, "ra')  # and a partial last line: a crash mid-write
    kept = records.resume_steps(path, 5)
    assert [r.step for r in kept] == [0, 1, 2, 3, 4]
    assert (tmp_path / "steps-rank0.jsonl.1").read_text() == text + '{"step": 8, "ra'  # all of it kept
    assert not path.exists()  # the resumed attempt writes a new file
    path.write_text(text)
    assert records.resume_steps(path, 0) == [] and (tmp_path / "steps-rank0.jsonl.2").read_text() == text
    path.write_text(text)
    assert len(records.resume_steps(path, 8)) == 8 and path.exists()  # nothing dropped: nothing to keep


# --- stall diagnosis from heartbeats (hand-made) -----------------------------------------------
def _beat(rank: int, phase: str, t: float, done: int = 4, step: int = 5) -> dict:
    return {
        "rank": rank,
        "host": f"n{rank}",
        "pid": 1,
        "step": step,
        "done": done,
        "phase": phase,
        "since": t - 12,
        "time": t,
    }


def test_diagnose_names_the_rank_not_waiting_in_comm() -> None:
    from hpctrain.train.watchdog import diagnose

    now = 1000.0
    out = diagnose({0: _beat(0, "comm", now), 1: _beat(1, "data", now), 2: _beat(2, "comm", now)}, 3, now)
    assert [(s.rank, s.host, s.why) for s in out] == [
        (1, "n1", "in data of step 5 for 12 s (last completed step 4)")
    ]


def test_diagnose_names_a_rank_whose_heartbeat_stopped() -> None:
    from hpctrain.train.watchdog import diagnose

    now = 1000.0
    out = diagnose({0: _beat(0, "comm", now), 1: _beat(1, "compute", now - 9)}, 2, now)
    assert [(s.rank, s.responsive) for s in out] == [(1, False)]
    assert out[0].why == (
        "no heartbeat (9 s ago): stopped, or hung outside Python, last completed step 4, in compute of step 5"
    )
    assert diagnose({0: _beat(0, "comm", now)}, 2, now)[0].why.startswith("no heartbeat (never)")


def test_diagnose_names_everyone_when_all_wait_in_comm() -> None:
    from hpctrain.train.watchdog import diagnose

    now = 1000.0
    out = diagnose({0: _beat(0, "comm", now), 1: _beat(1, "comm", now)}, 2, now)
    assert [s.rank for s in out] == [0, 1] and out[0].why.endswith("(every rank waits in communication)")


class _Planted:
    """What an attacker adds to a checkpoint: unpickling it would run a shell command."""

    def __init__(self, mark: Path) -> None:
        self.mark = mark

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"touch {self.mark}",))


def test_a_checkpoint_carrying_code_is_refused_and_never_run(tmp_path: Path) -> None:
    """train.resume_from on a shared file system: someone added a pickled callable to the newest
    checkpoint. Resuming refuses that file, naming it, runs nothing, and takes the one before."""
    _two_checkpoints(tmp_path)
    newest = tmp_path / "checkpoints" / "step-000020.pt"
    mark = tmp_path / "pwned"
    state = torch.load(newest, weights_only=True)
    torch.save({**state, "extra": _Planted(mark)}, newest)
    r, w = _restore(tmp_path)
    assert not mark.exists()  # the planted command never ran
    assert (r.step, r.path.name, w) == (10, "step-000010.pt", 1.0)
    [note] = r.skipped
    assert note == "step-000020.pt was refused and not run: it holds posix.system, not only tensors"
    with pytest.raises(checkpoint.UnsafeCheckpoint) as e:  # read alone, the file is named with the reason
        checkpoint.load(newest, *_state(0.0), None)
    assert str(newest) in str(e.value) and "(posix.system): refused and not run" in str(e.value)
    assert not mark.exists()
