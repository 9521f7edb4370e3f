"""Stall detection (train.stall_timeout_s), real runs: a rank hung in Python, a rank stopped by
SIGSTOP, locally and on SLURM. The run ends naming the stalled rank, its host, its step and
phase, with its Python stack; nothing is left running."""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path

import pytest

from tests.conftest import (
    HOROVOD_IDLE,
    hpctrain,
    lines,
    processes_of,
    start_hpctrain,
    wait_for,
    wait_until_gone,
)

# 10 s, not less: each rank's stall clock starts as it builds its model, and on a loaded machine
# (CI, a pipeline's ranks) rank 0 was still building its model when a 6 s clock ran out: the
# report rightly named rank 0, "in build", and not the rank the test hangs
STALL = ["data=digits", "train.warmup_steps=1", "train.stall_timeout_s=10"]
HANG = ["debug.slow_rank=1", "debug.slow_s=100000"]  # rank 1 sleeps in its first backward pass
IDLE = [HOROVOD_IDLE]  # the ranks left waiting for the stalled one (conftest.HOROVOD_IDLE)


# ranks started without MPI; Horovod over Gloo waits for the hung rank in its comm phase (DDP waits
# inside backward(), where the waiting rank reads as in compute too, under mpirun as under spawn).
# In 20-ms cycles, as over MPI: Gloo's 1-ms ones took 14 CPU-s of the run, 20-ms ones 7.5.
SPAWNED = ["cluster.starter=spawn", "parallelism.backend=gloo", HOROVOD_IDLE]


# FSDP and a pipeline wait for the hung rank inside torch.distributed's code while their phase is
# still compute: the waiting rank is told from the hung one by where it waits (watchdog.in_collective).
# The pipelines run DDP's engine: a stage waits in torch's point-to-point code whatever the engine,
# and Horovod's background thread, with nothing to average, spins in MPI meanwhile (25.9 -> 10.4
# CPU-s for the run, by the system's busy time)
QUIET_STAGES = "parallelism.engine=ddp"
SHARDED = ["parallelism=fsdp", "cluster.ranks=2"]
ONE_F_ONE_B = [
    "parallelism=pipeline",
    "parallelism.schedule=1f1b",
    "model=mlp",
    "model.depth=4",
    "cluster.ranks=2",
    QUIET_STAGES,
]


@pytest.mark.mpi
@pytest.mark.side_stream  # mostly waits for the stall timeout
@pytest.mark.parametrize(
    "starter", [IDLE, SPAWNED, SHARDED, ONE_F_ONE_B], ids=["mpirun", "spawn", "fsdp", "pipeline-1f1b"]
)
def test_a_rank_hung_in_python_is_named_with_its_stack(tmp_path: Path, starter: list[str]) -> None:
    run_dir = tmp_path / "hang"
    r = hpctrain(
        "run", "--no-progress", f"run.dir={run_dir}", *STALL, "train.steps=20", *HANG, *starter, timeout=300
    )
    assert r.returncode == 4, r.stdout + r.stderr
    assert (
        "rank 1 failed: Stalled: no step completed for 10 s (train.stall_timeout_s); stalled: rank 1 on "
        in r.stderr
    )
    assert "in compute of step 0" in r.stderr and "(no step completed yet)" in r.stderr, r.stderr
    # its Python stack, where it hangs: written by the rank itself, or (if its watchdog thread is
    # too slow to answer on a loaded machine) read from outside by py-spy, in py-spy's format
    assert re.search(
        r'(train/step|pipeline/pipe)\.py", line \d+, in \w+|\w+ \(\S*(train/step|pipeline/pipe)\.py:\d+\)',
        r.stderr,
    )
    stall = json.loads((run_dir / "stall.json").read_text())
    assert [s["rank"] for s in stall["stalled"]] == [1]  # only
    if starter is SHARDED:  # over torch.distributed: its flight recorder says where each rank is
        assert "flight recorder (the last collective each rank entered):" in r.stderr, r.stderr
        assert any(re.search(r"rank\(s\) 0 entered gloo:\S+ #\d+ and wait for it; never joined: rank 1 at #", line)
                   for line in stall["flight"]), stall["flight"]  # fmt: skip
        assert (run_dir / "flight-rank0.json").exists() and (run_dir / "flight-rank1.json").exists()
    assert not processes_of(run_dir)


# a pipeline's stage 1 stopped: its peer then times out too, yet the stalled rank is the one named
PIPELINE = ["parallelism=pipeline", "model=mlp", "model.depth=4", "cluster.ranks=2", QUIET_STAGES]


@pytest.mark.mpi
@pytest.mark.side_stream  # mostly waits for the stall timeout
@pytest.mark.parametrize("layout", [IDLE, PIPELINE], ids=["data", "pipeline"])
def test_a_stopped_rank_is_named_and_its_stack_read_from_outside(tmp_path: Path, layout: list[str]) -> None:
    run_dir = tmp_path / "stopped"
    proc = start_hpctrain("run", "--no-progress", f"run.dir={run_dir}", *STALL, "train.steps=100000", *layout)
    try:
        wait_for("30 steps", lambda: lines(run_dir / "steps-rank1.jsonl") >= 30)
        wait_for("a heartbeat", lambda: (run_dir / "heartbeat-rank1.json").exists())
        pid = json.loads((run_dir / "heartbeat-rank1.json").read_text())["pid"]
        os.kill(pid, signal.SIGSTOP)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 4, out + err
    assert (
        "rank 1 failed: Stalled:" in err
        and "no heartbeat (" in err
        and "stopped, or hung outside Python" in err
    )
    # py-spy read the stopped process (its format: "function (file:line)"); the training loop's
    # frame is always on the stack, wherever in a step (or between steps) the rank was stopped
    assert re.search(r"\w+ \(\S*hpctrain/train/loop\.py:\d+\)", err), err
    assert json.loads((run_dir / "stall.json").read_text())["stalled"][0]["rank"] == 1
    state = json.loads((run_dir / "state.json").read_text())  # the message and the state agree
    assert state["failure"]["rank"] == 1 and state["failure"]["cause"].startswith("Stalled"), state
    wait_until_gone(run_dir)


@pytest.mark.slurm
@pytest.mark.usefixtures("slurm_cluster")
def test_a_stall_on_slurm_is_named_by_status(tmp_path: Path) -> None:
    run_dir = tmp_path / "slurm"
    slurm = ["cluster=slurm", "cluster.ranks_per_node=2", HOROVOD_IDLE]
    r = hpctrain(
        "run", "--no-progress", f"run.dir={run_dir}", *slurm, *STALL, "train.steps=20", *HANG, timeout=300
    )
    assert r.returncode == 4, r.stdout + r.stderr
    assert "rank 1 failed: Stalled: no step completed for 10 s" in r.stderr, r.stderr
    status = hpctrain("status", str(run_dir)).stdout
    assert "rank 1 failed: Stalled" in status and "FAILED" in status, status


def _rank_process(run_dir: Path, rank: int) -> int | None:
    """The pid of a rank of the run (its command line names the run directory, its environment
    its rank), once it has started."""
    for line in processes_of(run_dir):
        pid = int(line.split()[0])
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in env:
            return pid
    return None


@pytest.mark.mpi
@pytest.mark.side_stream  # mostly waits for the stall timeout
def test_a_rank_that_never_joins_ends_the_run_within_the_stall_timeout_naming_it(tmp_path: Path) -> None:
    """Round 5, class 4: under spawn, a rank stopped before it joined held the others in torch's
    30-minute wait for the store, with C++ frames on the console; the stall timeout never fired."""
    run_dir = tmp_path / "unjoined"
    proc = start_hpctrain(
        "run", "--no-progress", f"run.dir={run_dir}", "data=digits", "train.stall_timeout_s=8", "train.steps=50",
        "parallelism.engine=ddp", "cluster.starter=spawn",
    )  # fmt: skip
    try:
        wait_for("rank 1 to start", lambda: _rank_process(run_dir, 1), timeout_s=60)
        pid = _rank_process(run_dir, 1)
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)  # before it could import torch, let alone join
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 4, out + err
    assert "rank(s) 1 of 2 never joined the ranks' meeting point 127.0.0.1:" in err, err
    assert "within 8 s (train.stall_timeout_s); rank 0 waited there" in err
    assert "Traceback" not in err and "c10::" not in err, err  # one line, no C++ frames
    wait_until_gone(run_dir)


@pytest.mark.mpi
def test_a_master_port_in_use_is_one_line_naming_the_port(tmp_path: Path) -> None:
    """Round 5, class 8: a MASTER_PORT another program holds printed rank 0's 50-line traceback."""
    import socket

    with socket.socket() as held:
        held.bind(("0.0.0.0", 0))
        held.listen(1)
        port = held.getsockname()[1]
        r = hpctrain(
            "run", "--no-progress", f"run.dir={tmp_path / 'run'}", "data=digits", "train.steps=8",
            "parallelism.engine=ddp", f"cluster.env={{MASTER_PORT: '{port}'}}", own_process=True,
        )  # fmt: skip
    assert r.returncode == 4, r.stdout + r.stderr
    assert f"rank 0 could not host the ranks' meeting point 127.0.0.1:{port}: " in r.stderr, r.stderr
    assert "address already in use" in r.stderr and "Traceback" not in r.stdout + r.stderr
