"""Runs as job steps of one held allocation (launch/slurm/allocation.py): the holding script, the
step's command, the step's id and its state, as pure text. The real thing runs on the local
SLURM cluster in tests/slurm/test_tune_slurm.py."""

from __future__ import annotations

import shlex
from pathlib import Path

from hpctrain.config import load_config
from hpctrain.launch.slurm.allocation import clean_env, hold_script, logged_step, step_command, step_id
from hpctrain.launch.slurm.plan import SlurmPlan, plan_slurm
from hpctrain.launch.slurm.sacct import parse_sacct
from hpctrain.records import State


def _plan(*overrides: str, folder: str = "/runs/my tune/trial-0/submitit") -> SlurmPlan:
    cfg = load_config(["cluster=slurm", "cluster.nodes=2", "cluster.ranks_per_node=4", *overrides])
    return plan_slurm(cfg, "/runs/my tune/trial-0", "/venv/bin/python", folder)


def test_the_holding_script_asks_for_the_runs_resources_and_only_waits() -> None:
    plan = _plan(
        "cluster.partition=gpu", "cluster.gpus_per_node=4", "cluster.exclude=[n3]", "train.max_restarts=1"
    )
    text = hold_script(plan.executor, "t-alloc", 70, Path("/runs/my tune/allocation/release"))
    sbatch = {line for line in text.splitlines() if line.startswith("#SBATCH")}
    for want in ("--nodes=2", "--ntasks-per-node=4", "--partition=gpu", "--exclude=n3", "--time=70",
                 "--job-name=t-alloc", "--no-kill", "--gpus-per-node=4"):  # fmt: skip
        assert f"#SBATCH {want}" in sbatch, text
    # nothing in it checkpoints or runs ranks: no signal before the limit, no srun, no teardown
    assert not any("--signal" in line for line in sbatch), text
    body = [line for line in text.splitlines() if line and not line.startswith("#")]
    # until released, or until the command holding it has not touched its heartbeat for 3 minutes
    # (killed with SIGKILL, its host lost: issue 72, class 1)
    assert body == [
        "while [ ! -e '/runs/my tune/allocation/release' ]; do [ $(( $(date +%s) - $(stat -c %Y "
        "'/runs/my tune/allocation/heartbeat' 2>/dev/null || echo 0) )) -lt 180 ] || exit 0; sleep 1; done"
    ], text


def test_the_holding_script_ends_once_released_or_when_the_heartbeat_goes_stale(tmp_path: Path) -> None:
    """The loop itself, run by bash: released, stale, missing heartbeat; a fresh one holds."""
    import os
    import subprocess
    import time

    script = hold_script(_plan().executor, "t", 10, tmp_path / "release")
    beat, release = tmp_path / "heartbeat", tmp_path / "release"

    def ends(timeout: float) -> bool:
        try:
            subprocess.run(["bash", "-c", script], timeout=timeout, check=True)
            return True
        except subprocess.TimeoutExpired:
            return False

    assert ends(5)  # no heartbeat at all: nobody holds it
    beat.touch()
    os.utime(beat, (time.time() - 200, time.time() - 200))
    assert ends(5)  # stale
    beat.touch()
    assert not ends(2.5)  # fresh: it holds
    release.touch()
    assert ends(5)


def test_a_step_runs_the_plan_on_the_allocation_with_its_shape_setup_and_logs() -> None:
    plan = _plan("cluster.gpus_per_node=2", "cluster.cpus_per_rank=3", "cluster.setup=[module load cuda]")
    lines = step_command(plan, "4661", "hpctrain-trial-0").splitlines()
    assert lines[0] == "set -e" and "module load cuda" in lines and "export SUBMITIT_EXECUTOR=slurm" in lines
    # the plan's own exports (the ranks' environment) come before srun, as in a batch script
    exports = [line for line in lines if line.startswith("export ") and "=" in line]
    assert len(exports) > 1 and lines.index(exports[0]) < len(lines) - 1
    argv = shlex.split(lines[-1].removeprefix("exec "))
    assert argv[:2] == ["srun", "--jobid=4661"] and "--job-name=hpctrain-trial-0" in argv
    for want in (
        "--nodes=2",
        "--ntasks-per-node=4",
        "--cpus-per-task=3",
        "--gpus-per-node=2",
        "--kill-on-bad-exit=1",
    ):
        assert want in argv, argv
    logs = "/runs/my tune/trial-0/submitit/%j.%s_%t_log"
    assert (
        argv[argv.index("--output") + 1] == f"{logs}.out" and argv[argv.index("--error") + 1] == f"{logs}.err"
    )
    assert argv[-5:] == [
        "/venv/bin/python",
        "-u",
        "-m",
        "submitit.core._submit",
        "/runs/my tune/trial-0/submitit",
    ]


def test_a_steps_id_is_read_from_its_rank_logs_names_without_asking_the_controller() -> None:
    assert logged_step({"4661.3_0_log.out", "4661.3_1_log.out", "4661.3_0_log.err"}, "4661") == "4661.3"
    assert logged_step({"46610.3_0_log.out"}, "4661") is None  # another job's (a longer id)
    assert logged_step({"4661.batch_0_log.out", "srun.err", "4661_submitted.pkl"}, "4661") is None
    assert logged_step({"4661.3_0_log.err"}, "4661") is None  # its .out is what says it started
    assert logged_step(set(), "4661") is None


def test_the_steps_id_is_found_by_its_name_and_its_state_by_that_id() -> None:
    steps = "4661.batch|batch\n4661.0|hpctrain-trial-0\n4661.1|hpctrain-trial-1\n"
    assert step_id(steps, "4661", "hpctrain-trial-1") == "4661.1"
    assert step_id(steps, "4661", "hpctrain-trial-2") is None
    assert step_id("4662.0|hpctrain-trial-1\n", "4661", "hpctrain-trial-1") is None  # another job's
    sacct = (
        "4661|t-alloc|RUNNING|2|00:00:08|0:0|n[1-2]|None\n"
        "4661.batch|batch|RUNNING|1|00:00:08|0:0|n1|\n"
        "4661.0|hpctrain-trial-0|COMPLETED|2|00:00:03|0:0|n[1-2]|\n"
        "4661.1|hpctrain-trial-1|CANCELLED by 0|2|00:00:01|0:15|n[1-2]|\n"
    )
    found = parse_sacct(sacct, frozenset({"4661.1"}))
    assert set(found) == {"4661", "4661.1"}  # the allocation, and only the steps asked for
    assert found["4661.1"].state == State.CANCELLED and found["4661.1"].nodes == 2
    assert set(parse_sacct(sacct)) == {"4661"}  # a plain job's steps are never runs


def test_the_submitting_hosts_allocation_does_not_leak_into_the_step() -> None:
    env = {"SLURM_JOB_ID": "9", "SLURM_NNODES": "1", "SLURM_CONF": "/etc/slurm.conf", "PATH": "/bin"}
    assert clean_env(env) == {"SLURM_CONF": "/etc/slurm.conf", "PATH": "/bin"}
