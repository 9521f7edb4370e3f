"""Nothing a run creates is writable by another user, even under a group-writable umask (002, the
default for users with their own group on many clusters): the ranks import the code snapshot,
unpickle submitit's job files and run the plan's command from the run directory, so whoever could
write there could run code as the run's owner (issue 36, security)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.mpi


def test_a_run_under_a_group_writable_umask_leaves_nothing_others_can_write(user_project: Path) -> None:
    run_dir = user_project.parent / "private"
    r = subprocess.run(
        [
            sys.executable, "-m", "hpctrain.cli", "run", "--no-progress", f"run.dir={run_dir}",
            "model._target_=mypkg.nets.TwoLayer", "data._target_=mypkg.data.blobs", "train.steps=6",
            "train.warmup_steps=1", "cluster.ranks=2", "cluster.checkpoint_interval=4", "code.snapshot=true",
        ],
        capture_output=True, text=True, cwd=user_project, timeout=300,
        preexec_fn=lambda: os.umask(0o002),
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    made = [run_dir, *run_dir.rglob("*")]
    assert any(p.name == "code" for p in made) and any(
        p.suffix == ".pt" for p in made
    )  # snapshot, checkpoint
    writable = [
        f"{p} {stat.filemode(p.lstat().st_mode)}"
        for p in made
        if not p.is_symlink() and p.lstat().st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    ]
    assert not writable, writable
