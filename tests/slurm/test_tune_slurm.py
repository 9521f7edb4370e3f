"""hpctrain tune on the local SLURM cluster: the trials run as job steps of one allocation on 2
nodes (one wait in the queue), found again by status; a cancelled tune leaves nothing in the
queue and resumes in a new allocation; the best settings are predicted at 4 nodes or the reason
is given."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import DIGITS_CNN, hpctrain, start_hpctrain, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_cluster")]

TUNE = [
    *DIGITS_CNN, "cluster=slurm", "cluster.nodes=2", "cluster.ranks_per_node=1", "parallelism.engine=ddp",
    "tune.keys=[parallelism.gradient_as_bucket_view]", "tune.target_ranks=4",
    "debug.slow_rank=0", "debug.slow_s=0.2",  # a trial long enough to be cancelled while it runs
]  # fmt: skip


def _queued(job_id: str) -> str:
    return subprocess.run(["squeue", "-h", "-j", job_id], capture_output=True, text=True).stdout.strip()


def _allocation(home: Path) -> str:
    return str(json.loads((home / "allocation" / "job.json").read_text())["job_id"])


def test_a_tune_runs_its_trials_as_steps_of_one_allocation_and_a_cancelled_one_resumes(
    tmp_path: Path,
) -> None:
    home = tmp_path / "tune"
    proc = start_hpctrain("tune", *TUNE, f"run.dir={home}")
    wait_for("trial-0's step", lambda: (home / "trial-0" / "job.json").exists() or proc.poll() is not None)
    cancelled = hpctrain("cancel", str(home))
    out, err = proc.communicate(timeout=120)
    assert cancelled.returncode == 0 and proc.returncode != 0, out + err + cancelled.stdout + cancelled.stderr
    assert "cancelled" in err, err
    first = _allocation(home)
    wait_for("the allocation to leave the queue", lambda: not _queued(first), 60)
    status = hpctrain("status", str(home)).stdout
    assert re.search(rf"trial-0 .*{first}\.0 .*CANCELLED", status) and re.search(
        rf"allocation .*{first} ", status
    ), status

    r = hpctrain("tune", "--resume", str(home), timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    second = _allocation(home)
    assert second != first and not _queued(second)
    m = json.loads((home / "tune.json").read_text())
    assert [t["changed"] for t in m["trials"]] == [[], ["parallelism.gradient_as_bucket_view=true"]], m
    for k, t in enumerate(m["trials"]):
        job = json.loads((home / t["name"] / "job.json").read_text())
        summary = json.loads((home / t["name"] / "summary.json").read_text())
        # each trial a step of the one allocation, on both of its nodes
        assert job["launcher"] == "slurm" and job["job_id"] == f"{second}.{k}", job
        assert len({x["host"] for x in summary["per_rank"]}) == 2, summary
        # the view is not in the step model: tried, never predicted
        assert t["predicted_s"] is None and t["step_s"] == summary["step_s"]
    assert list(home.glob("trial-0.failed-*")), "the cancelled attempt is set aside, not overwritten"
    said = [line for line in r.stdout.splitlines() if line.startswith(("best at 4 ranks:", "no prediction"))]
    assert len(said) == 1, r.stdout
    status = hpctrain("status", str(home)).stdout
    assert len(re.findall(rf"trial-([01]) .*{second}\.\1 .*COMPLETED", status)) == 2, status
    assert re.search(rf"allocation .*{second} .*COMPLETED", status), status  # released, not cancelled
