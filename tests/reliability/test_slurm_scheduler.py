"""What the scheduler says reaches the user: why a job waits, that it can never start, which
rank failed and how, that it was cancelled, and the user's submit limit (real local cluster)."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest

from tests.conftest import IDLE_TRAINING, hpctrain, hpctrain_here, sacct_state, start_hpctrain, wait_for

# a rank killed by a signal, a job cancelled: its tasks' processes as srun starts them
pytestmark = [pytest.mark.slurm, pytest.mark.cold_start, pytest.mark.usefixtures("slurm_cluster")]

SMALL = ["cluster=slurm", "data=digits", "train.steps=8", "train.warmup_steps=1"]
# the local cluster's `tiny` partition has a 10-minute limit: a longer job there is accepted, never
# started (more nodes than its one is refused before submitting: test_..._refused_before_anything)
TOO_BIG = ["cluster.partition=tiny", "cluster.time_min=20"]


def test_a_job_that_can_never_start_is_reported_and_not_waited_on(tmp_path: Path) -> None:
    r = hpctrain("run", "--no-progress", f"run.dir={tmp_path / 'r'}", *SMALL, *TOO_BIG, timeout=300)
    assert r.returncode == 3, r.stdout + r.stderr
    assert "job pending: PartitionConfig" in r.stdout  # said while waiting, as the scheduler says it
    assert (
        "can never start as submitted (pending: PartitionConfig: the job asks for more than its " in r.stderr
    )
    job = json.loads((tmp_path / "r" / "job.json").read_text())["job_id"]
    wait_for("the job cancelled", lambda: sacct_state(job) == "CANCELLED", timeout_s=60)


def test_status_shows_the_pending_reason(tmp_path: Path) -> None:
    run_dir = tmp_path / "p"
    r = hpctrain("run", "--no-wait", f"run.dir={run_dir}", *SMALL, *TOO_BIG)
    assert r.returncode == 0, r.stderr
    try:
        wait_for(
            "a pending reason",
            lambda: "pending: PartitionConfig" in hpctrain("status", str(run_dir)).stdout,
        )
        assert "it can never start as submitted: cancel it" in hpctrain("status", str(run_dir)).stdout
    finally:
        hpctrain("cancel", str(run_dir))


def test_a_killed_rank_is_named_with_its_node_and_signal(tmp_path: Path) -> None:
    run_dir = tmp_path / "k"
    kill = ["debug.fail_rank=1", "debug.fail_step=3", "debug.fail_mode=kill", "cluster.ranks_per_node=2"]
    r = hpctrain("run", "--no-progress", f"run.dir={run_dir}", *SMALL, *kill, timeout=300)
    assert r.returncode == 4, r.stdout + r.stderr
    assert "rank 1 failed: killed by signal 9 (SIGKILL) on n" in r.stderr, r.stderr
    status = hpctrain("status", str(run_dir)).stdout
    assert "rank 1 failed: killed by signal 9 (SIGKILL)" in status, status


def test_a_job_cancelled_by_the_user_is_reported_as_cancelled(tmp_path: Path) -> None:
    run_dir = tmp_path / "c"
    proc = start_hpctrain(
        "run",
        "--no-progress",
        f"run.dir={run_dir}",
        *SMALL[:2],
        "train.steps=100000",
        "cluster.ranks_per_node=2",
        *IDLE_TRAINING,
    )
    try:
        wait_for("steps", lambda: (run_dir / "steps-rank0.jsonl").exists(), timeout_s=180)
        job = json.loads((run_dir / "job.json").read_text())["job_id"]
        subprocess.run(["scancel", job], check=True)  # by the user, outside hpctrain
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
    assert proc.returncode == 130, out + err
    assert f"job {job} was cancelled" in err and "failed" not in err, err


@pytest.fixture
def max_submit_jobs_5():
    def limit(n: int) -> None:
        subprocess.run(
            ["sacctmgr", "-i", "modify", "user", "where", "name=root", "set", f"MaxSubmitJobs={n}"],
            check=True,
            capture_output=True,
        )

    limit(5)
    try:
        yield
    finally:
        limit(-1)


def test_a_sweep_beyond_the_users_submit_limit_is_refused_before_anything(
    tmp_path: Path, max_submit_jobs_5: None
) -> None:
    r = hpctrain("run", "-m", *SMALL, "train.seed=range(6)", f"run.output_root={tmp_path}")
    assert r.returncode == 3, r.stdout + r.stderr
    assert "6 run(s) exceed what SLURM lets you queue now: MaxSubmitJobs=5" in r.stderr, r.stderr
    assert not list(tmp_path.iterdir())  # not even the sweep directory


def test_a_dry_run_of_a_large_sweep_prints_index_ranges_per_array() -> None:
    r = hpctrain_here("run", "-m", *SMALL, "train.seed=range(1500)", "--dry-run")
    assert r.returncode == 0, r.stderr
    assert "# arrays of at most 1001 runs (the cluster's MaxArraySize)" in r.stdout
    assert "# array 1/2 of this shape: 1001 run(s), sweep points 0-1000" in r.stdout
    assert "# array 2/2 of this shape: 499 run(s), sweep points 1001-1499" in r.stdout
    assert "#SBATCH --array=0-1000%64" in r.stdout and "(the same script with --array=0-498)" in r.stdout
    assert max(len(line) for line in r.stdout.splitlines()) < 400  # ranges, not 1500 indices


@pytest.mark.parametrize(
    "overrides, said",
    [
        (["cluster.nodelist=[n1,n9]"], "cluster.nodelist[1]: 'n9' is not a node of this cluster"),
        (
            ["cluster.exclude=[n1,n2,n3,n4]"],
            "cluster.exclude: leaves 0 of the 4 nodes of the default partition",
        ),
        # issue 72, class 2: SLURM queues these (PartitionNodeLimit, PartitionConfig) where an
        # allocation asks for them, and they wait for ever
        (["cluster.nodes=8"], "cluster.nodes: asks for 8 nodes; the default partition has 4"),
        (["cluster.partition=tiny", "cluster.nodes=2"], "partition tiny lets a job have 1 (MaxNodes)"),
        (["cluster.ranks_per_node=4"], "need 4 CPUs; the nodes of the default partition have 2 at most"),
    ],
)
def test_nodes_the_cluster_cannot_give_are_refused_before_anything_is_created(
    tmp_path: Path, overrides: list[str], said: str
) -> None:
    """Round 5, class 8: such a job reached sbatch (exit 3) after its run directory was made."""
    run = tmp_path / "run"
    r = hpctrain_here("run", "cluster=slurm", "data=digits", f"run.dir={run}", *overrides)
    assert r.returncode == 2 and said in r.stderr, r.stdout + r.stderr
    assert not run.exists()


@pytest.mark.parametrize(
    ("shape", "said"),
    [
        (["study.nodes=[1,8]"], "cluster.nodes: asks for 8 nodes; the default partition has 4"),
        (["study.nodes=[1,2]", "cluster.ranks_per_node=4"], "cluster.ranks_per_node: 4 ranks x 1 CPUs"),
    ],
    ids=["8-nodes", "the-tutorials-4-ranks-per-node"],
)
def test_a_one_allocation_study_that_cannot_fit_is_refused_before_submitting(
    tmp_path: Path, shape: list[str], said: str
) -> None:
    """Issue 72, class 2: its allocation pended on PartitionNodeLimit for the default 24 h."""
    before = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True).stdout
    r = hpctrain_here(
        "study", "strong", "--no-progress", "cluster=slurm", "data=digits", "study.one_allocation=true",
        "study.allreduce_bench=false", f"run.output_root={tmp_path}", *shape,
    )  # fmt: skip
    assert r.returncode == 2 and said in r.stderr, r.stdout + r.stderr
    after = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True).stdout
    assert set(after.split()) <= set(before.split()), after  # nothing submitted
    assert not any(tmp_path.iterdir()), list(tmp_path.iterdir())  # class 8: nor a study directory made
