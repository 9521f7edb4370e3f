"""Issue 72, class 1: an allocation that `study` (study.one_allocation) or `tune` holds never
outlives the command. Ctrl-C, SIGTERM or SIGHUP while it is still pending (other jobs hold the
nodes) left it queued: it started when they ended and held its nodes idle until its time limit.
Real local cluster: a job on every node keeps the allocation pending while the command is signalled."""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import DIGITS_CNN, start_hpctrain, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_cluster")]

STUDY = [
    "study", "strong", "--no-progress", "cluster=slurm", "study.nodes=[1,2]", "study.steps=4", "study.warmup_steps=1",
    "study.global_batch=16", "study.one_allocation=true", "study.allreduce_bench=false", "data=digits",
]  # fmt: skip
TUNE = [
    "tune",
    *DIGITS_CNN,
    "cluster=slurm",
    "cluster.nodes=2",
    "parallelism.engine=ddp",
    "tune.keys=[parallelism.gradient_as_bucket_view]",
]


def _state(job_id: str) -> str:
    out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True).stdout
    return out.strip()


@pytest.fixture(scope="module")
def nodes_taken() -> Iterator[None]:
    """Every node of the default partition held by someone else's job."""
    out = subprocess.run(
        ["sbatch", "--parsable", "-N4", "-J", "someone-else", "-o", "/dev/null", "--wrap", "sleep 600"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    job = out.strip().split(";")[0]
    try:
        wait_for("the other job to run", lambda: _state(job) == "RUNNING", timeout_s=180)
        yield
    finally:
        subprocess.run(["scancel", job], capture_output=True)


@pytest.mark.parametrize(
    ("command", "sig"),
    [(STUDY, signal.SIGINT), (TUNE, signal.SIGTERM), (STUDY, signal.SIGHUP)],
    ids=["study-ctrl-c", "tune-sigterm", "study-sighup"],
)
def test_a_pending_allocation_leaves_the_queue_with_the_command(
    nodes_taken: None, tmp_path: Path, command: list[str], sig: signal.Signals
) -> None:
    where = f"run.dir={tmp_path / 'tune'}" if command is TUNE else f"run.output_root={tmp_path}"
    proc = start_hpctrain(*command, where)
    try:
        found = lambda: list(tmp_path.rglob("allocation/job.json"))  # noqa: E731
        wait_for("the allocation", lambda: found() or proc.poll() is not None, timeout_s=120)
        job = str(json.loads(found()[0].read_text())["job_id"])
        wait_for("it to pend", lambda: _state(job) == "PENDING", timeout_s=30)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 130, out + err
        wait_for("the allocation to leave the queue", lambda: _state(job) == "", timeout_s=10)
        assert "Traceback" not in err and "bug" not in err, err
    finally:
        proc.kill()
