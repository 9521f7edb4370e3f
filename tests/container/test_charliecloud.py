"""The training image built and run for real with Charliecloud (hpctrain container build; CI
builds it in the background while the other tests run, cached afterwards): two ranks in the image
train exactly as on the host, a failing rank is named, and on the local SLURM cluster two nodes
match one rank and a requeue resumes bit-identically, over srun --mpi=pmix into the image."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from hpctrain.launch.container.store import default_storage, image_dir
from tests.conftest import (
    DIGITS_CNN,
    MLP,
    assert_rank_1_failure_named,
    assert_same_weights,
    hpctrain,
    recorded_steps,
    run_ok,
    signal_at_step,
    start_run,
    wait_done,
    wait_until_gone,
    weights,
)

pytestmark = pytest.mark.container
CH = ["cluster.container.runtime=charliecloud"]


@pytest.fixture(scope="session")
def image() -> str:
    """The image's digest. `hpctrain container build` waits for a build already under way (one
    lock per storage), then finds the image cached by what went into it."""
    r = hpctrain("container", "build", timeout=1800)
    assert r.returncode == 0, r.stdout + r.stderr
    # not a worktree of ch-image's build cache: hpctrain's record in it would leave it dirty and
    # the build after next would fail in `git checkout`
    assert not (image_dir(default_storage(), "hpctrain") / ".git").exists()
    r = hpctrain("container", "show")
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout.split()[1]


def assert_ran_inside(run_dir: Path, digest: str) -> None:
    inside = json.loads((run_dir / "env.json").read_text())["container"]
    assert (inside["runtime"], inside["image"], inside["inside"]) == ("charliecloud", "hpctrain", True)
    assert inside["digest"] == digest  # what the ranks read inside the image
    outside = json.loads((run_dir / "container.json").read_text())
    assert outside["digest"] == digest and outside["version"].startswith("ch-run 0.")


@pytest.mark.mpi
def test_two_ranks_in_the_image_train_bit_identically_to_the_host(
    tmp_path: Path, image: str, reference
) -> None:
    run, s = run_ok(tmp_path, "ch", *DIGITS_CNN, "cluster.ranks=2", "train.batch_per_rank=16", *CH)
    a, b = weights(run), weights(reference[0])
    assert all(torch.equal(a[k], b[k]) for k in a), "the image's weights differ from the host's"
    assert s["world_size"] == 2
    assert_ran_inside(run, image)


@pytest.mark.mpi
def test_a_failing_rank_in_the_image_is_named(tmp_path: Path, image: str) -> None:
    assert_rank_1_failure_named(tmp_path, "exception", *DIGITS_CNN, "train.steps=40", *CH)


@pytest.mark.mpi
def test_the_users_script_and_model_run_in_the_image(user_project: Path, image: str) -> None:
    """script= and a _target_ model from code.dir: the user's code reaches the ranks in the image."""
    from tests.mpi.test_user_code import HVD_THROUGHPUT, USER_MODEL
    from tests.mpi.test_user_code import run_ok as run_user

    run_dir, s = run_user(
        user_project, "hvd", "script=scripts/hvd_train.py", "script.args=[--steps,3]", HVD_THROUGHPUT, *CH
    )
    assert s["throughput_samples_per_s"] > 0 and s["world_size"] == 2
    assert_ran_inside(run_dir, image)
    run_dir, s = run_user(user_project, "model", *USER_MODEL, "train.steps=4", *CH)
    assert s["model"] == "mypkg.nets.TwoLayer" and s["last_loss"] < s["first_loss"]
    assert_ran_inside(run_dir, image)


@pytest.mark.slurm
@pytest.mark.usefixtures("slurm_cluster")
def test_two_nodes_in_the_image_match_one_rank_and_a_requeue_resumes_bit_identically(
    tmp_path: Path, image: str, mlp_one_rank
) -> None:
    common = [
        *MLP,
        *CH,
        "cluster=slurm",
        "cluster.nodes=2",
        "cluster.ranks_per_node=1",
        "train.batch_per_rank=null",
        "train.global_batch=32",
    ]
    run_dir = tmp_path / "interrupted"
    r = hpctrain("run", "--no-wait", f"run.dir={run_dir}", *common, "debug.hold_step=4")
    assert r.returncode == 0, r.stderr
    straight = start_run(tmp_path / "straight", *common)
    job = signal_at_step(run_dir, 4)  # what SLURM sends before the time limit
    assert wait_done(job) == "COMPLETED"
    log = hpctrain("logs", str(run_dir)).stdout
    assert "requeue" in log.lower(), log
    for rank in (0, 1):
        assert recorded_steps(run_dir, rank) == list(range(8))
    assert wait_done(straight) == "COMPLETED"
    assert_same_weights(tmp_path / "straight", mlp_one_rank[0], rtol=1e-5, atol=1e-6)
    a, b = weights(run_dir), weights(tmp_path / "straight")
    assert all(torch.equal(a[k], b[k]) for k in a), "weights differ from the uninterrupted run"
    # the requeue ended every task of the first incarnation: no rank lives on outside the job
    wait_until_gone(run_dir)
    assert_ran_inside(run_dir, image)
    hosts = {r["host"] for r in json.loads((run_dir / "summary.json").read_text())["per_rank"]}
    assert len(hosts) == 2, hosts
