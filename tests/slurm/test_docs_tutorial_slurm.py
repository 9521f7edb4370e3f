"""docs/tutorials/slurm.md's own-script step on the local SLURM cluster, with the commands the page
shows (read from it by tests/docs): a user's torch.distributed script, in a git project of their
own, dry-run, then submitted across 2 nodes, where every rank finds the world the page promises
(init_process_group() with no arguments) and the script's arguments."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.conftest import hpctrain
from tests.docs.test_commands import page_command

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_cluster")]
PAGE = "docs/tutorials/slurm.md"

TRAIN = """\
import argparse, os
import torch
import torch.distributed as dist

ap = argparse.ArgumentParser()
ap.add_argument("--epochs", type=int)
ap.add_argument("--lr", type=float)
args = ap.parse_args()
dist.init_process_group("gloo")  # RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT come from hpctrain
t = torch.ones(1)
dist.all_reduce(t)
print(f"rank {dist.get_rank()} of {dist.get_world_size()} local {os.environ['LOCAL_RANK']}: "
      f"epochs {args.epochs} lr {args.lr} sum {t.item():g}", flush=True)
dist.destroy_process_group()
"""


def _project(tmp: Path) -> Path:
    """~/myproject of the page: a git repository holding train.py (the job runs a snapshot of it)."""
    home = tmp / "myproject"
    home.mkdir()
    (home / "train.py").write_text(TRAIN)
    git = ["git", "-C", str(home), "-c", "user.email=user@example.org", "-c", "user.name=user"]
    for step in (["init", "-q"], ["add", "train.py"], ["commit", "-q", "-m", "train"]):
        subprocess.run([*git, *step], check=True)
    return home


def test_the_tutorials_own_script_runs_across_two_nodes(tmp_path: Path) -> None:
    project = _project(tmp_path)
    dry = page_command(PAGE, "hpctrain run script=train.py")
    assert "--dry-run" in dry
    r = hpctrain(*dry, cwd=project)
    assert r.returncode == 0 and "#SBATCH --nodes=2" in r.stdout, r.stdout + r.stderr
    argv = [a for a in dry if a != "--dry-run"]
    run_dir = tmp_path / "run"
    r = hpctrain(*argv, "--no-progress", f"run.dir={run_dir}", cwd=project)
    assert r.returncode == 0, r.stdout + r.stderr
    for rank in range(4):  # 2 nodes of the slurm option's 2 ranks each
        out = hpctrain("logs", str(run_dir), "--rank", str(rank)).stdout
        assert f"rank {rank} of 4 local {rank % 2}: epochs 3 lr 0.1 sum 4" in out, out
    s = json.loads((run_dir / "summary.json").read_text())
    assert s["world_size"] == 4 and len({r["host"] for r in s["per_rank"]}) == 2
    assert (run_dir / "code" / "train.py").read_text() == TRAIN  # the snapshot the page describes
