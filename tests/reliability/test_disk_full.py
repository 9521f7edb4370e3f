"""A full disk under a real run: the run directory on a 512 KiB tmpfs that this test mounts and
unmounts (nothing else on the machine fills up). The run ends with exit status 4 naming
ENOSPC and the file, state.json records the outcome (it keeps its space reserved while the run
is live), status agrees, the step records written so far stay readable, and nothing is left."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpctrain import records
from tests.conftest import hpctrain, processes_of, small_tmpfs

pytestmark = [
    pytest.mark.mpi,
    pytest.mark.side_stream,
]  # mostly starts, stops and reads runs: beside the SLURM stream


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    with small_tmpfs(tmp_path / "small", "512k") as mnt:
        yield mnt


def run_until_full(run_dir: Path, *overrides: str) -> tuple[subprocess.CompletedProcess[str], str]:
    """A run whose directory fills up: it must fail (exit 4); its output, and what the failure
    says before the rank's last output."""
    r = hpctrain(
        "run", "--no-progress", f"run.dir={run_dir}", "train.save_model=false", *overrides, timeout=300
    )
    assert r.returncode == 4, r.stdout + r.stderr
    return r, r.stderr.split("last output")[0]


def test_a_full_disk_is_named_and_the_records_stay_consistent(small_fs: Path) -> None:
    run_dir = small_fs / "r"
    r, said = run_until_full(run_dir, "data=digits", "train.steps=100000", "train.log_interval=1")
    # the file named, in the run directory (which write fills the disk first, log or steps, varies)
    assert re.search(
        rf"No space left on device \(errno ENOSPC\) writing {re.escape(str(run_dir))}/\S+", said
    ), said
    assert "Traceback" not in said, r.stderr
    state = json.loads((run_dir / "state.json").read_text())
    assert state["state"] == "FAILED" and "No space left on device" in json.dumps(state["failure"]), state
    status = hpctrain("status", str(run_dir), timeout=60)
    assert status.returncode == 0 and "FAILED" in status.stdout, status.stdout + status.stderr
    steps = records.read_steps(run_dir / "steps-rank0.jsonl")  # a cut last line is left out
    assert len(steps) > 10 and [s.step for s in steps] == list(range(len(steps)))
    assert not processes_of(run_dir)


def test_a_full_disk_during_a_sharded_save_names_the_checkpoint(tmp_path: Path) -> None:
    """FSDP's ranks each write their shard: the disk fills in the save, and the error says so
    (before, only the log file the supervisor could not write was named)."""
    with small_tmpfs(tmp_path / "small", "16m") as mnt:
        run_dir = mnt / "r"
        r, said = run_until_full(
            run_dir,
            "parallelism=fsdp",
            "model=mlp",
            "model.width=1024",
            "cluster.ranks=2",
            "train.steps=50",
            "cluster.checkpoint_interval=1",
            # a line logged per step could be the write that meets the full disk first (seen once)
            "train.log_interval=50",
        )
        assert "No space left on device" in said and ".dcp" in said, r.stderr
        assert (
            not (run_dir / "checkpoints" / "latest").exists()
            or (
                run_dir
                / "checkpoints"
                / (run_dir / "checkpoints" / "latest").read_text().strip()
                / ".metadata"
            ).is_file()
        )  # latest, if any, names a complete checkpoint
        assert not processes_of(run_dir)
