"""A cluster without accounting (no slurmdbd, as some sites run): the local cluster started with
SLURM_ACCOUNTING=none (its own state, ports and two nodes, beside the session's cluster). A run
is waited for and completes, a failed rank is named, and status says what its states rest on,
instead of waiting for an accounting record that never comes (submitit's result() would)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT, SLURM_VERSION, clients_first, hpctrain, start_hpctrain, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.slurm_second, pytest.mark.usefixtures("slurm_cluster")]

STATE = Path(f"/tmp/hpctrain-slurm-noacct-{SLURM_VERSION}")
ENV = {
    "SLURM_ACCOUNTING": "none",
    "HPCTRAIN_SLURM_STATE": str(STATE),
    "HPCTRAIN_SLURM_PORT_BASE": "17300" if SLURM_VERSION == "22.05" else "17400",
    "HPCTRAIN_SLURM_NODES": "2",
}
RUN = ["--no-progress", "cluster=slurm", "data=digits", "train.steps=4", "train.warmup_steps=0"]


@pytest.fixture(scope="module")
def no_accounting() -> Iterator[dict[str, str]]:
    env = dict(os.environ, **ENV)
    up = subprocess.run(
        ["bash", str(ROOT / "slurm" / "start.sh")], env=env, capture_output=True, text=True, timeout=300
    )
    assert up.returncode == 0, up.stdout + up.stderr
    assert "accounting: none" in up.stdout
    path = clients_first(STATE / "bin") if SLURM_VERSION != "22.05" else os.environ["PATH"]
    yield {"SLURM_CONF": str(STATE / "etc" / "slurm.conf"), "PATH": path}
    down = subprocess.run(
        ["bash", str(ROOT / "slurm" / "stop.sh"), "--purge"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert down.returncode == 0 and not STATE.exists(), down.stdout + down.stderr
    left = subprocess.run(["pgrep", "-f", "--", f"-f {STATE}/etc/slurm.conf"], capture_output=True, text=True)
    assert not left.stdout, f"daemons of the cluster without accounting still run: {left.stdout}"


def test_runs_are_waited_for_and_named_without_accounting(
    no_accounting: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for k, v in no_accounting.items():
        monkeypatch.setenv(k, v)
    off = subprocess.run(["sacct", "-n"], capture_output=True, text=True, timeout=30)
    assert off.returncode != 0 and "accounting storage is disabled" in off.stderr.lower(), off.stderr
    ok, failed = tmp_path / "ok", tmp_path / "failed"
    r = hpctrain("run", f"run.dir={ok}", *RUN, timeout=180, own_process=True)
    assert r.returncode == 0, r.stdout + r.stderr
    r = hpctrain(
        "run",
        f"run.dir={failed}",
        *RUN,
        "cluster.nodes=2",
        "debug.fail_rank=1",
        "debug.fail_step=2",
        timeout=180,
    )
    assert r.returncode == 4, r.stdout + r.stderr
    assert "rank 1 failed" in r.stderr and "InjectedFailure" in r.stderr
    status = (
        hpctrain("status", str(ok), timeout=60).stdout + hpctrain("status", str(failed), timeout=60).stdout
    )
    assert "COMPLETED" in status and "FAILED" in status and "InjectedFailure" in status, status
    # what the states rest on: the controller's memory of jobs that ended (MinJobAge), said once
    assert (
        "note: accounting unavailable (sacct: Slurm accounting storage is disabled); from the controller"
        in status
    )


def test_a_controller_that_stops_answering_mid_wait_is_waited_for_not_a_failed_run(
    no_accounting: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """slurmctld stopped (SIGSTOP) for longer than MessageTimeout while `hpctrain run` waits: its
    queries time out ("Socket timed out on send/recv operation") and, without accounting to fall
    back on, nothing answers; they are asked again with back-off, and the run completes once the
    controller answers again (before, the first unanswered look ended the wait as a failure)."""
    for k, v in no_accounting.items():
        monkeypatch.setenv(k, v)
    run = tmp_path / "paused"
    proc = start_hpctrain("run", "--no-progress", f"run.dir={run}", *RUN[1:], "train.steps=30")
    wait_for("the run's first step", lambda: (run / "steps-rank0.jsonl").exists(), timeout_s=300)
    ctld = int((STATE / "run" / "slurmctld.pid").read_text())
    os.kill(ctld, signal.SIGSTOP)
    try:
        time.sleep(25)  # MessageTimeout is 20 s: the waiting command's queries time out meanwhile
    finally:
        os.kill(ctld, signal.SIGCONT)
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, out + err
    assert (run / "summary.json").exists()


def test_the_cluster_comes_up_at_once_after_a_stop_every_time(no_accounting: dict[str, str]) -> None:
    """stop.sh returns only when every daemon of its cluster and their children are gone, and
    start.sh right after it comes up (a start had once met the old controller still exiting);
    another cluster's controller running meanwhile (the session's) is neither waited for nor stopped."""
    env = dict(os.environ, **ENV)

    def controllers() -> set[str]:  # of the other clusters
        found = subprocess.run(["pgrep", "-af", "slurmctld -f "], capture_output=True, text=True).stdout
        return {line.split()[0] for line in found.splitlines() if str(STATE) not in line}

    others = controllers()
    assert others, "the session's own cluster runs beside this one"
    for _ in range(3):
        down = subprocess.run(
            ["bash", str(ROOT / "slurm" / "stop.sh")], env=env, capture_output=True, text=True, timeout=120
        )
        assert down.returncode == 0, down.stdout + down.stderr
        up = subprocess.run(
            ["bash", str(ROOT / "slurm" / "start.sh")], env=env, capture_output=True, text=True, timeout=120
        )
        assert up.returncode == 0 and "2 nodes idle" in up.stdout, up.stdout + up.stderr
    assert others <= controllers()
