"""The local launcher never leaves ranks behind: whatever kills `hpctrain run` or its supervisor
(SIGKILL included, with a rank stopped by SIGSTOP that ignores everything but SIGKILL), every
process of the run is gone within seconds. mpirun failing to start is a launch error (exit 3)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from tests.conftest import hpctrain, lines, processes_of, start_hpctrain, wait_for, wait_until_gone

pytestmark = [
    pytest.mark.mpi,
    pytest.mark.side_stream,
    # as users start them: it tells a rank's processes by their command lines, which a warm rank
    # shares with its client (failed warm: 4 rank processes, not 2), signals groups, stops ranks
    pytest.mark.cold_start,
]  # mostly starts, stops and reads runs: beside the SLURM stream

LONG = ["data=digits", "train.steps=100000", "train.log_interval=1000", "--no-progress"]


def _rank_pids(run_dir: Path) -> list[int]:
    return [int(p.split()[0]) for p in processes_of(run_dir) if "hpctrain.rank" in p and "mpirun" not in p]


def _dead(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] in ("Z", "X")
    except OSError:
        return True


def _start(run_dir: Path, *extra: str) -> subprocess.Popen[str]:
    return start_hpctrain("run", f"run.dir={run_dir}", *LONG, *extra)


KILLED = {  # what the waiting command, state.json and status say when this process is SIGKILLed
    "hpctrain run": None,  # nobody is left to say anything; status says it (the supervisor saw)
    "the supervisor": "the run failed: the local supervisor (pid {pid}) was killed before it recorded an outcome",
    "mpirun": "the run failed: mpirun was killed by signal 9 (SIGKILL) from outside hpctrain",
}


@pytest.mark.parametrize("victim", list(KILLED))
def test_a_sigkill_leaves_no_process_even_with_a_stopped_rank(tmp_path: Path, victim: str) -> None:
    run_dir = tmp_path / "k"
    proc = _start(run_dir)
    try:
        wait_for("10 steps", lambda: lines(run_dir / "steps-rank0.jsonl") >= 10)
        ranks = _rank_pids(run_dir)
        assert len(ranks) == 2, processes_of(run_dir)
        os.kill(ranks[1], signal.SIGSTOP)  # a stuck rank: only SIGKILL (or SIGCONT) moves it
        supervisor = json.loads((run_dir / "job.json").read_text())["pid"]
        if victim == "hpctrain run":
            proc.kill()
        elif victim == "the supervisor":
            os.kill(supervisor, signal.SIGKILL)
        else:
            [mpirun] = [int(p.split()[0]) for p in processes_of(run_dir) if p.split()[2].endswith("mpirun")]
            os.kill(mpirun, signal.SIGKILL)
        wait_until_gone(run_dir)
        said = KILLED[victim]
        if said is not None:  # the command, state.json and status agree on what failed
            said = said.format(pid=supervisor)
            _, err = proc.communicate(timeout=60)
            assert proc.returncode == 4 and said in err, err
            state = json.loads((run_dir / "state.json").read_text())
            assert state["state"] == "FAILED", state
            assert state["failure"]["cause"].startswith(said.removeprefix("the run failed: ")), state
            status = hpctrain("status", str(run_dir), timeout=60)
            assert "FAILED" in status.stdout, status.stdout
    finally:
        proc.kill()
        proc.wait()
        for p in _rank_pids(run_dir):
            os.kill(p, signal.SIGKILL)


@pytest.mark.parametrize(
    ("how", "said"),
    [
        (["cluster.mpirun=/bin/false"], "(it printed nothing)"),
        (["cluster.extra_args=[--no-such-flag]"], 'unknown option "--no-such-flag"'),
    ],
)
def test_mpirun_that_fails_to_start_is_a_launch_error(tmp_path: Path, how: list[str], said: str) -> None:
    r = hpctrain("run", f"run.dir={tmp_path / 'r'}", "data=digits", "train.steps=8", *how, timeout=120)
    assert r.returncode == 3, r.stdout + r.stderr
    assert "failed before any rank started (exit status 1)" in r.stderr and said in r.stderr, r.stderr
    assert "rank" not in r.stderr.split("failed before")[0] and "Traceback" not in r.stderr


def test_a_rank_killed_just_before_a_cancel_is_still_recorded(tmp_path: Path) -> None:
    """Round 5, class 10: SIGTERM to the waiting command while mpirun was aborting after a rank
    was SIGKILLed recorded CANCELLED with the killed rank nowhere and mpirun's own crash (-11) as
    the exit status. Whichever the supervisor sees first, the killed rank is in state.json."""
    run_dir = tmp_path / "run"
    proc = start_hpctrain("run", "--no-progress", f"run.dir={run_dir}", "data=digits", "train.steps=100000")
    try:
        wait_for("a heartbeat", lambda: (run_dir / "heartbeat-rank1.json").exists())
        wait_for("steps", lambda: lines(run_dir / "steps-rank1.jsonl") >= 5)
        pid = json.loads((run_dir / "heartbeat-rank1.json").read_text())["pid"]
        os.kill(pid, signal.SIGKILL)
        wait_for("rank 1 to die", lambda: _dead(pid))  # then the cancel, while mpirun aborts
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode in (130, 4), out + err
    state = json.loads((run_dir / "state.json").read_text())
    assert state["failure"] is not None and state["failure"]["rank"] == 1, state
    cause = state["failure"]["cause"]  # as mpirun reported it, or as the supervisor found it gone
    assert "signal 9" in cause or f"had ended before the cancel (pid {pid})" in cause, state
    assert state["exit_code"] is None or state["exit_code"] >= 0, state
    wait_until_gone(run_dir)
