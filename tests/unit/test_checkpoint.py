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


def test_process_killed_mid_write_leaves_latest_intact(tmp_path: Path) -> None:
    """A real SIGKILL during a large write: the previous checkpoint stays the latest and loads."""
    model, opt = _state(1.0)
    checkpoint.save(tmp_path, 10, model, opt, None)
    code = f"""
import os, signal, torch
from pathlib import Path
from hpctrain import records
real = os.fsync
def die(fd):  # the data is written but not yet renamed: the worst moment
    os.kill(os.getpid(), signal.SIGKILL)
os.fsync = die
records.write_atomic(Path({str(tmp_path)!r}) / "checkpoints" / "step-000020.pt", b"x" * 50_000_000)
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True)
    assert r.returncode == -9
    assert checkpoint.latest(tmp_path).name == "step-000010.pt"
    assert not (tmp_path / "checkpoints" / "step-000020.pt").exists()
    fresh, fresh_opt = _state(0.0)
    assert checkpoint.load(checkpoint.latest(tmp_path), fresh, fresh_opt, None) == 10


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
