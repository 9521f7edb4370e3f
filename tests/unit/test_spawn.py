"""The spawn starter without a run: its command line, each rank's environment, its failure report
in mpirun's words (which the supervisor parses), and when a local plan chooses it."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from hpctrain.config import load_config
from hpctrain.engine.world import TORCHRUN, gloo_timeout_env, launcher_place, place_values, torch_env
from hpctrain.facts import HostFacts
from hpctrain.launch.local.plan import plan_local
from hpctrain.launch.local.spawn import UsageError, failure_report, parse, rank_environment
from hpctrain.launch.output import mpirun_failure


def test_the_command_line_takes_mpiruns_flags_and_the_rank_command() -> None:
    a = parse(["-np", "3", "--tag-output", "-x", "A=1", "-x", "B", "--", "python", "-m", "x"], {"B": "b"})
    assert (a.ranks, a.tag, a.env, a.command) == (3, True, {"A": "1", "B": "b"}, ["python", "-m", "x"])


@pytest.mark.parametrize(
    "argv",
    [
        ["-np", "0", "--", "x"],
        ["-np", "two", "--", "x"],
        ["-np", "2"],
        ["-np", "2", "--"],
        ["--bogus", "--", "x"],
    ],
)
def test_a_bad_command_line_is_refused(argv: list[str]) -> None:
    with pytest.raises(UsageError):
        parse(argv, {})


def test_each_rank_gets_torchruns_variables_and_the_users_master_wins() -> None:
    env = rank_environment({"MASTER_ADDR": "10.0.0.9", "PATH": "/bin"}, {"MASTER_PORT": "29500"}, 1, 4)
    assert env["RANK"] == "1" and env["WORLD_SIZE"] == "4" and env["LOCAL_RANK"] == "1"
    assert env["LOCAL_WORLD_SIZE"] == "4" and env["MASTER_PORT"] == "29500"
    assert env["MASTER_ADDR"] == "10.0.0.9" and env["PATH"] == "/bin"
    # the ranks know where they stand from these alone (no mpirun, no srun)
    assert launcher_place(env) is TORCHRUN
    assert place_values(env, "test")[1] == (1, 4, 1, 4)
    assert torch_env(env) == {}  # nothing to add: the spawner set it all


@pytest.mark.parametrize("code, said", [(3, "exited with status 3"), (-9, "killed by signal 9 (Killed)")])
def test_a_failed_rank_is_reported_as_mpirun_reports_it(code: int, said: str) -> None:
    rank, cause = mpirun_failure(failure_report(1, 4242, code)) or (None, "")
    assert rank == 1 and cause.startswith(said)


def test_the_spawner_stops_the_others_when_one_rank_fails_and_returns_its_status(tmp_path) -> None:
    # rank 1 exits 3 once rank 0 has printed (a marker file: on a loaded machine rank 0 once had
    # not started printing when it was stopped); rank 0 would sleep for a minute: it is stopped
    ready = tmp_path / "rank0-printed"
    child = (
        "import os, pathlib, sys, time; r = int(os.environ['RANK']); print('rank', r, flush=True); "
        f"m = pathlib.Path({str(ready)!r})\n"
        "if r == 0:\n    m.touch(); time.sleep(60)\n"
        "else:\n    [time.sleep(0.05) for _ in range(600) if not m.exists()]; sys.exit(3)\n"
    )
    r = subprocess.run(
        [sys.executable, "-m", "hpctrain.launch.local.spawn", "-np", "2", "--tag-output", "--"]
        + [sys.executable, "-c", child],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 3
    assert "[1,0]<stdout>:rank 0" in r.stdout and "[1,1]<stdout>:rank 1" in r.stdout
    assert mpirun_failure(r.stderr) == (1, "exited with status 3")


def test_the_spawner_forwards_a_stop_signal_to_every_rank() -> None:
    p = subprocess.Popen(
        [sys.executable, "-m", "hpctrain.launch.local.spawn", "-np", "2", "--"]
        + [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert p.stdout is not None
    assert p.stdout.readline() and p.stdout.readline()  # both ranks are up
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=20) == 128 + signal.SIGTERM


def plan_argv(facts: HostFacts, *overrides: str) -> list[str]:
    return plan_local(load_config(list(overrides)), facts, "/runs/r", "/venv/bin/python").argv


def test_auto_spawns_without_mpirun_unless_something_needs_mpi() -> None:
    no_mpi = HostFacts.example(mpirun_found=False)
    assert plan_argv(no_mpi, "parallelism.engine=ddp")[1:3] == ["-m", "hpctrain.launch.local.spawn"]
    assert plan_argv(no_mpi, "parallelism.backend=gloo")[1:3] == ["-m", "hpctrain.launch.local.spawn"]
    assert plan_argv(no_mpi)[0] == "mpirun"  # Horovod over MPI: mpirun (whose absence submit names)
    assert plan_argv(no_mpi, "parallelism.engine=ddp", "bench.allreduce=true")[0] == "mpirun"
    assert plan_argv(HostFacts.example(), "parallelism.engine=ddp")[0] == "mpirun"  # found: as before
    assert (
        plan_argv(HostFacts.example(), "parallelism.engine=ddp", "cluster.starter=spawn")[0]
        == "/venv/bin/python"
    )


def test_the_spawn_command_carries_the_plans_environment() -> None:
    argv = plan_argv(HostFacts.example(), "parallelism.engine=ddp", "cluster.starter=spawn")
    assert argv[argv.index("--") :] == ["--", "/venv/bin/python", "-m", "hpctrain.rank", "/runs/r"]
    assert "MASTER_PORT" in argv and "-np" in argv and argv[argv.index("-np") + 1] == "2"


def test_waiting_for_a_local_run_returns_once_its_supervisor_has_left(tmp_path) -> None:
    """The outcome is recorded before the supervisor exits: `hpctrain run` waits for the exit too,
    so nothing of the run outlives the command (a suite run once caught the supervisor alive)."""
    import socket

    from hpctrain import records
    from hpctrain.launch.base import Job
    from hpctrain.launch.local.launcher import LocalLauncher, process_start
    from hpctrain.launch.local.supervisor import write_state

    write_state(tmp_path, "COMPLETED", exit_code=0)  # recorded; the supervisor still finishing
    lingering = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"])
    ref = records.new(
        records.JobRef,
        launcher="local",
        job_id=str(lingering.pid),
        world_size=1,
        pid=lingering.pid,
        pid_start=process_start(lingering.pid),
        host=socket.gethostname(),
    )
    states = LocalLauncher().wait([Job(tmp_path, ref)], timeout_s=30, poll_s=0.05)
    assert states[str(lingering.pid)].state == "COMPLETED"
    assert lingering.poll() is not None or process_start(lingering.pid) is None  # gone (or a zombie)
    lingering.wait()


@pytest.mark.parametrize(
    ("started", "said"), [(False, "was cancelled before it started"), (True, "was cancelled")]
)
def test_a_run_cancelled_while_it_waited_says_it_never_started(tmp_path, started: bool, said: str) -> None:
    """A killed study's runs queued behind the stopped one were reported as plain 'cancelled'."""
    from hpctrain import records
    from hpctrain.launch.base import Job, JobStatus
    from hpctrain.launch.local.launcher import LocalLauncher
    from hpctrain.launch.local.supervisor import write_state

    if started:
        write_state(tmp_path, "RUNNING")
    write_state(tmp_path, "CANCELLED")
    job = Job(tmp_path, records.new(records.JobRef, launcher="local", job_id="7", world_size=2))
    message = str(LocalLauncher().failure(job, JobStatus("7", "CANCELLED")))
    assert message.endswith(said) and (started or "before it started" in message)
    assert started == ("before it started" not in message)


def test_horovods_gloo_meeting_waits_as_long_as_the_stall_timeout_never_less_than_its_own() -> None:
    """Horovod's Gloo store gives the ranks 30 s to meet; hpctrain gives them the stall timeout,
    as the torch engines' meeting has, and keeps what the user set."""
    assert gloo_timeout_env({}, 600.0) == {"HOROVOD_GLOO_TIMEOUT_SECONDS": "600"}
    assert gloo_timeout_env({}, 45.5) == {"HOROVOD_GLOO_TIMEOUT_SECONDS": "46"}
    assert gloo_timeout_env({}, 6.0) == {"HOROVOD_GLOO_TIMEOUT_SECONDS": "30"}  # Horovod's own floor
    assert gloo_timeout_env({"HOROVOD_GLOO_TIMEOUT_SECONDS": "5"}, 600.0) == {}
