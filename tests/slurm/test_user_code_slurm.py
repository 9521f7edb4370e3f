"""The user's own code on the local SLURM cluster: a model and dataset by import path across 2
nodes, unmodified Horovod and DDP scripts across 2 nodes, a sweep of script arguments as one
job array sharing one code snapshot, and an hpctrain.api script requeued mid-run, which resumes
bit-identically although the user edited the code while it was queued."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.conftest import assert_same_weights, hpctrain, signal_at_step, start_run, wait_until_gone
from tests.mpi.test_user_code import USER_MODEL, run_ok
from tests.slurm.test_slurm_runs import _recorded_steps, _wait_done

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_cluster")]

TWO_NODES = ["cluster=slurm", "cluster.nodes=2", "cluster.ranks_per_node=1"]


def log(run_dir: Path, rank: int) -> str:
    r = hpctrain("logs", str(run_dir), "--rank", str(rank))
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_a_user_model_on_two_nodes_matches_one_local_rank(user_project: Path) -> None:
    slurm, s = run_ok(user_project, "slurm", *USER_MODEL, *TWO_NODES, "train.batch_per_rank=16")
    local, _ = run_ok(user_project, "local", *USER_MODEL, "cluster.ranks=1", "train.batch_per_rank=32")
    assert_same_weights(slurm, local, rtol=1e-5, atol=1e-6)
    assert len({r["host"] for r in s["per_rank"]}) == 2  # really two nodes
    code = json.loads((slurm / "code.json").read_text())  # the job ran a snapshot of the project
    assert code["source"] == str(user_project) and code["dirty"] is False and len(code["commit"]) == 40
    assert (slurm / "code" / "mypkg" / "nets.py").read_text() == (
        user_project / "mypkg" / "nets.py"
    ).read_text()
    env = json.loads((slurm / "env.json").read_text())
    assert env["code"]["dir"] == str(slurm / "code") and env["code"]["commit"] == code["commit"]


@pytest.mark.parametrize(
    "script, args, line",
    [
        ("hvd_train.py", "[--steps,5]", "rank {r} of 2 (local 0)"),
        ("ddp_train.py", "[3]", "rank {r} of 2 local 0"),
    ],
)
def test_unmodified_scripts_run_across_two_nodes(
    user_project: Path, script: str, args: str, line: str
) -> None:
    run_dir, s = run_ok(user_project, script, *TWO_NODES, f"script=scripts/{script}", f"script.args={args}")
    for r in (0, 1):
        assert line.format(r=r) in log(run_dir, r)
    assert s["world_size"] == 2 and len({r["host"] for r in s["per_rank"]}) == 2


def test_a_sweep_of_script_arguments_is_one_array_with_one_snapshot(user_project: Path) -> None:
    sweep = user_project.parent / "s"
    r = hpctrain(
        "run",
        "-m",
        "--no-progress",
        *TWO_NODES,
        "script=scripts/api_train.py",
        "script.args=[8],[10]",
        "train.warmup_steps=2",
        f"run.dir={sweep}",
        cwd=user_project,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert not sweep.with_name("s-sweep").exists()  # run.dir of a sweep is the sweep directory
    manifest = json.loads((sweep / "sweep.json").read_text())
    assert len(manifest["arrays"]) == 1 and len(manifest["runs"]) == 2
    assert sorted(p.name for p in sweep.iterdir() if p.name.startswith("code")) == ["code", "code.json"]
    for point, steps in ((0, 8), (1, 10)):
        assert _recorded_steps(sweep / str(point), 0) == list(range(steps))


def test_an_api_script_requeued_mid_run_resumes_bit_identical_despite_an_edit(user_project: Path) -> None:
    common = [*TWO_NODES, "script=scripts/api_train.py", "train.steps=60", "train.warmup_steps=2"]
    run_dir = user_project.parent / "interrupted"
    r = hpctrain("run", "--no-wait", f"run.dir={run_dir}", *common, "script.args=[60,20]", cwd=user_project)
    assert r.returncode == 0, r.stderr
    # the uninterrupted run, alongside (submitted before the edit, as the interrupted one was)
    straight = start_run(user_project.parent / "straight", *common, "script.args=[60]", cwd=user_project)
    # the user edits the code at once, while the job is queued or running: neither its first
    # attempt nor the requeued one may see the edit
    marker = user_project / "mypkg" / "marker.py"
    marker.write_text(marker.read_text().replace('"original"', '"edited"').replace("0.05", "0.5"))
    job = signal_at_step(run_dir, 21)  # what SLURM sends before the time limit
    assert _wait_done(job) == "COMPLETED"
    out = log(run_dir, 0)
    assert f"resuming from {run_dir / 'checkpoints' / 'step-000021.pt'} at step 21" in out, out
    assert "code version original, starting at step 21" in out and "edited" not in out
    for rank in (0, 1):
        assert _recorded_steps(run_dir, rank) == list(range(60))  # none lost, none repeated
    s = json.loads((run_dir / "summary.json").read_text())
    assert s["timed_steps"] == 58
    marker.write_text(marker.read_text().replace('"edited"', '"original"').replace("0.5", "0.05"))
    assert _wait_done(straight) == "COMPLETED"
    a = torch.load(run_dir / "weights.pt")
    b = torch.load(user_project.parent / "straight" / "weights.pt")
    assert all(torch.equal(a[k], b[k]) for k in a), "weights differ from the uninterrupted run"


def test_a_script_hung_on_one_node_is_named_by_run_and_status(user_project: Path) -> None:
    """Issue 23: a hanging script on SLURM once ran for minutes with nothing detected. The script
    watchdog runs inside each SLURM task as it does under mpirun: rank 1 (on the second node) is
    named with its stack, the job fails and status agrees."""
    run_dir = user_project.parent / "hang-slurm"
    r = hpctrain(
        "run",
        "--no-progress",
        f"run.dir={run_dir}",
        *TWO_NODES,
        "script=scripts/hang.py",
        "script.stall_timeout_s=8",
        cwd=user_project,
        timeout=240,
    )
    assert r.returncode == 4, r.stdout + r.stderr
    said = "rank 1 failed: Stalled: no api.step, output or CPU use for 8 s (script.stall_timeout_s)"
    assert said in r.stderr and "hang.py" in r.stderr, r.stderr
    assert json.loads((run_dir / "stall.json").read_text())["stalled"][0]["rank"] == 1
    status = hpctrain("status", str(run_dir)).stdout
    assert "FAILED" in status and "rank 1 failed: Stalled" in status, status
    wait_until_gone(run_dir)  # rank 1's pool workers too: killed first, it could not end them
