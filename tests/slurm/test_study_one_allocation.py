"""study.one_allocation on the local SLURM cluster: a strong study of 1 and 2 nodes, 2 repetitions,
submitted with --analyze-as-job, is one job of 2 nodes whose first node runs hpctrain, which starts
every point as a job step of that job (the 1-node points on one of its nodes). Cancelled mid-way
(scancel: the kill), `hpctrain study resume` finishes it in a new allocation it holds from here and
says so, and the report names both allocations and the nodes."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import hpctrain, wait_done, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_cluster")]

STUDY = [
    "study", "strong", "--no-progress", "cluster=slurm", "cluster.ranks_per_node=1", "study.nodes=[1,2]",
    "study.repetitions=2", "study.steps=4", "study.warmup_steps=1", "study.global_batch=32",
    "study.one_allocation=true", "study.allreduce_bench=false", "data=digits", "run.name=oa",
]  # fmt: skip


def _nodes(job_id: str) -> set[str]:
    """The nodes SLURM's accounting gives the allocation, its ranges expanded."""
    listed = subprocess.run(
        ["sacct", "-n", "-P", "-X", "-o", "NodeList", "-j", job_id], capture_output=True, text=True
    ).stdout.split()[0]
    names = subprocess.run(["scontrol", "show", "hostnames", listed], capture_output=True, text=True).stdout
    return set(names.split())


def _summary(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


def test_a_study_in_one_allocation_runs_its_points_as_steps_on_the_same_nodes_and_resumes_in_a_new_one(
    tmp_path: Path,
) -> None:
    r = hpctrain(*STUDY, "--analyze-as-job", f"run.output_root={tmp_path}", timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    first = r.stdout.split("submitted the study as job ")[1].split(":")[0]
    [study] = list(tmp_path.glob("*/*-oa-strong"))
    wait_for("the study's first point", lambda: list(study.glob("n*-r*/summary.json")), timeout_s=240)
    subprocess.run(["scancel", first], check=True)  # killed mid-way: its steps end with it
    assert wait_done(first, 120) == "CANCELLED"
    assert json.loads((study / "study.json").read_text())["allocations"] == [first]

    r = hpctrain("study", "resume", str(study), "--no-progress", timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"the study ran in allocation {first} before; what is left runs in a new one" in r.stdout, r.stdout
    allocations = json.loads((study / "study.json").read_text())["allocations"]
    assert allocations[0] == first and len(allocations) == 2, allocations
    second = allocations[1]
    # every point a step of one of the two allocations; the last one of the second
    runs = {n: study / n for n in ("n1-r0", "n2-r0", "n1-r1", "n2-r1")}
    steps = {n: json.loads((d / "job.json").read_text())["job_id"] for n, d in runs.items()}
    assert all(s.split(".")[0] in (first, second) and "." in s for s in steps.values()), steps
    assert steps["n1-r0"].startswith(f"{first}.") and steps["n2-r1"].startswith(f"{second}."), steps
    # every point ran on the nodes of its allocation (2 nodes: the largest point's), a 1-node
    # point on one of them
    hosts = {n: _summary(d)["hosts"] for n, d in runs.items()}
    for n, step in steps.items():
        held = _nodes(step.split(".")[0])
        assert len(held) == 2 and len(hosts[n]) == int(n[1]) and set(hosts[n]) <= held, (n, hosts, held)
    report = (study / "report" / "report.md").read_text()
    assert f"job steps of 2 allocations (jobs {first}, {second}" in report, report
    assert not subprocess.run(["squeue", "-h", "-j", second], capture_output=True, text=True).stdout.strip()
    status = hpctrain("status", str(study)).stdout  # the points, each a step, and the allocation
    assert re.search(rf"│ allocation +│ +│ {second} +│ COMPLETED", status), status
    logs = hpctrain("logs", str(runs["n2-r1"])).stdout  # a step's rank logs, as a batch run's
    assert "step 4/4" in logs, logs

    # refused before anything exists where nothing holds nodes: locally
    r = hpctrain("study", "strong", "study.one_allocation=true", f"run.output_root={tmp_path / 'local'}")
    assert r.returncode == 2 and "study.one_allocation: holds one scheduler allocation" in r.stderr, r.stderr
    assert not (tmp_path / "local").exists()


def test_a_study_cancelled_in_its_allocation_ends_as_cancelled_not_as_srun_failing(tmp_path: Path) -> None:
    """Issue 72 class 8: `hpctrain cancel` of a study running in one allocation made the study
    exit 3 with srun's "Unable to create step" text; it was cancelled, and says so (exit 130)."""
    from tests.conftest import start_hpctrain

    study = [a for a in STUDY if a != "study.repetitions=2"]
    proc = start_hpctrain(*study, "study.repetitions=1", "study.steps=200", f"run.output_root={tmp_path}")
    try:
        wait_for("the study's first step", lambda: list(tmp_path.rglob("n1-r0/job.json")) or proc.poll() is not None, timeout_s=240)  # fmt: skip
        [home] = list(tmp_path.glob("*/*-oa-strong"))
        r = hpctrain("cancel", str(home))
        assert r.returncode == 0, r.stdout + r.stderr
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, out + err
    assert "srun" not in err and "Traceback" not in err, err
