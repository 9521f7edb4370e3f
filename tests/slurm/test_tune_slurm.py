"""hpctrain tune on the local SLURM cluster: the trials run as job steps of one allocation on 2
nodes (one wait in the queue), found again by status; a tune killed with SIGKILL leaves an
allocation that its resumption cancels, a cancelled one leaves nothing in the queue, and each
resumes in a new allocation; the best settings are predicted at 4 nodes or the reason is given."""

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
    # a trial (12 steps) outlasts KillWait (5 s): its ranks ignore SIGTERM (submitit's), so a
    # cancelled one ends when SLURM kills them, never by finishing first
    "debug.slow_rank=0", "debug.slow_s=0.5",
]  # fmt: skip


def _queued(job_id: str) -> str:
    """squeue's line of the job (its state spelled out), empty once it has left the queue."""
    out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%i %T"], capture_output=True, text=True).stdout
    return out.strip()


def _allocation(home: Path) -> str:
    return str(json.loads((home / "allocation" / "job.json").read_text())["job_id"])


def _step_of(home: Path, alloc: str) -> bool:
    """Whether a trial of `home` has started as a step of `alloc`."""
    for job in home.glob("trial-*/job.json"):
        if json.loads(job.read_text())["job_id"].startswith(f"{alloc}."):
            return True
    return False


@pytest.mark.slurm_versions
def test_a_tune_runs_its_trials_as_steps_of_one_allocation_and_survives_a_kill_and_a_cancel(
    tmp_path: Path,
) -> None:
    home = tmp_path / "tune"
    # killed (SIGKILL: nothing of it can clean up) while trial-0 runs: its allocation stays queued
    proc = start_hpctrain("tune", *TUNE, f"run.dir={home}")
    wait_for("trial-0's step", lambda: (home / "trial-0" / "job.json").exists() or proc.poll() is not None)
    proc.kill()
    proc.communicate(timeout=60)
    first = _allocation(home)
    # suspended (its steps' ranks stopped): trial-0 cannot finish before the resumption, however
    # long a loaded machine makes it take to start; a suspended allocation is cancelled too
    subprocess.run(["scontrol", "suspend", first], check=True, capture_output=True)
    assert "SUSPENDED" in _queued(first)
    # resumed: the leftover allocation is cancelled; then `hpctrain cancel` while a trial runs
    proc = start_hpctrain("tune", "--resume", str(home))
    wait_for("a step of a new allocation", lambda: _allocation(home) != first and _step_of(home, _allocation(home)) or proc.poll() is not None)  # fmt: skip
    cancelled = hpctrain("cancel", str(home))
    out, err = proc.communicate(timeout=120)
    assert cancelled.returncode == 0 and proc.returncode == 130, (
        out + err + cancelled.stdout + cancelled.stderr
    )
    assert f"allocation {first}, left by an earlier invocation, cancelled" in out and "--resume" in err, (
        out + err
    )
    second = _allocation(home)
    for alloc in (first, second):
        wait_for(f"allocation {alloc} to leave the queue", lambda a=alloc: not _queued(a), 60)
    status = hpctrain("status", str(home)).stdout
    assert re.search(rf"trial-0 .*{second}\.0 .*CANCELLED", status), status
    assert re.search(rf"allocation .*{second} .*CANCELLED", status), status

    r = hpctrain("tune", "--resume", str(home), timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    third = _allocation(home)
    assert third not in (first, second) and not _queued(third)
    m = json.loads((home / "tune.json").read_text())
    assert [t["changed"] for t in m["trials"]] == [[], ["parallelism.gradient_as_bucket_view=true"]], m
    for t in m["trials"]:
        job = json.loads((home / t["name"] / "job.json").read_text())
        summary = json.loads((home / t["name"] / "summary.json").read_text())
        # each trial a step of an allocation of this tune (one that finished earlier is read back)
        assert re.fullmatch(rf"({first}|{second}|{third})\.\d+", job["job_id"]), job
        assert len({x["host"] for x in summary["per_rank"]}) == 2, summary  # on both of its nodes
        # the view is not in the step model: tried, never predicted
        assert t["predicted_s"] is None and t["step_s"] == summary["step_s"]
    assert [json.loads((home / t / "job.json").read_text())["job_id"] for t in ("trial-0", "trial-1")] == [
        f"{third}.0",
        f"{third}.1",
    ]
    assert len(list(home.glob("trial-0.failed-*"))) == 2, "each stopped attempt is set aside"
    said = [line for line in r.stdout.splitlines() if line.startswith(("best at 4 ranks:", "no prediction"))]
    assert len(said) == 1, r.stdout
    status = hpctrain("status", str(home)).stdout
    assert len(re.findall(r"trial-[01] .*COMPLETED", status)) == 2, status
    assert re.search(rf"allocation .*{third} .*COMPLETED", status), status  # released, not cancelled
