"""A full disk under a real run: the run directory on a 512 KiB tmpfs that this test mounts and
unmounts (nothing else on the machine fills up). The run ends with exit status 4 naming
ENOSPC and the file, state.json records the outcome (it keeps its space reserved while the run
is live), status agrees, the step records written so far stay readable, and nothing is left."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpctrain import records
from tests.conftest import hpctrain, processes_of, small_tmpfs

pytestmark = pytest.mark.mpi


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    with small_tmpfs(tmp_path / "small", "512k") as mnt:
        yield mnt


def test_a_full_disk_is_named_and_the_records_stay_consistent(small_fs: Path) -> None:
    run_dir = small_fs / "r"
    r = hpctrain(
        "run",
        "--no-progress",
        f"run.dir={run_dir}",
        "data=digits",
        "train.steps=100000",
        "train.log_interval=1",
        "train.save_model=false",
        timeout=300,
    )
    assert r.returncode == 4, r.stdout + r.stderr
    assert (
        "No space left on device" in r.stderr and "(errno ENOSPC)" in r.stderr or "[Errno 28]" in r.stderr
    ), r.stderr
    assert "Traceback" not in r.stderr.split("last output")[0], r.stderr
    state = json.loads((run_dir / "state.json").read_text())
    assert state["state"] == "FAILED" and "No space left on device" in json.dumps(state["failure"]), state
    status = hpctrain("status", str(run_dir), timeout=60)
    assert status.returncode == 0 and "FAILED" in status.stdout, status.stdout + status.stderr
    steps = records.read_steps(run_dir / "steps-rank0.jsonl")  # a cut last line is left out
    assert len(steps) > 10 and [s.step for s in steps] == list(range(len(steps)))
    assert not processes_of(run_dir)
