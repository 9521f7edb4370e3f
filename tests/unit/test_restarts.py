"""Which failures a restart can outlive, and the restart records (records/restarts.py)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from hpctrain.config import load_config
from hpctrain.errors import ConfigError
from hpctrain.orchestrate.validate import validate
from hpctrain.records import ErrorRecord, State, write_json
from hpctrain.records.restarts import (
    RESTARTS,
    Restart,
    attempt,
    newest_checkpoint,
    not_restartable,
    read_restarts,
    record,
    restart_for,
    set_aside,
    why_not,
)


def _error(kind: str, message: str = "boom", rank: int = 1) -> ErrorRecord:
    return ErrorRecord(rank, "n1", kind, message, "Traceback ...", 1.0)


@pytest.mark.parametrize(
    ("error", "restartable"),
    [
        (None, True),  # killed by a signal, or lost with its node: it wrote nothing
        (_error("Stalled"), True),
        (_error("CommError"), True),
        (_error("InjectedFailure"), True),
        (_error("DistBackendError"), True),
        (_error("RuntimeError", "[../gloo/transport/tcp/pair.cc:534] Connection closed by peer"), True),
        (_error("ValueError"), False),
        (_error("OutOfMemoryError", "CUDA out of memory"), False),
        (_error("ConfigError"), False),
    ],
)
def test_a_restart_is_for_a_broken_world_not_for_wrong_code(
    error: ErrorRecord | None, restartable: bool
) -> None:
    why = not_restartable(error)
    assert (why is None) == restartable
    if error is not None and not restartable:
        assert why == (
            f"not restarted: rank 1 raised {error.type}, an error of the code or the configuration "
            "that a restart would raise again"
        )


def test_the_attempt_counts_restarts_and_slurm_requeues() -> None:
    assert attempt({}) == 0
    assert attempt({"HPCTRAIN_ATTEMPT": "2"}) == 2
    assert attempt({"SLURM_RESTART_COUNT": "3"}) == 3
    assert attempt({"HPCTRAIN_ATTEMPT": "1", "SLURM_RESTART_COUNT": "3"}) == 4  # restarted, requeued
    assert attempt({"HPCTRAIN_ATTEMPT": "x"}) == 0


def test_a_restart_record_counts_what_was_redone_and_lost(tmp_path: Path) -> None:
    ckpts = tmp_path / "checkpoints"
    ckpts.mkdir()
    for name, written in (("step-000004.pt", 1000.0), ("step-000008.dcp", 1100.0), ("step-000012.pt.tmp", 0)):
        (ckpts / name).mkdir() if name.endswith(".dcp") else (ckpts / name).write_text("x")
        os.utime(ckpts / name, (written, written))
    assert newest_checkpoint(tmp_path) == (8, 1100.0)  # a .tmp is not published yet
    (tmp_path / "steps-rank0.jsonl").write_text("{}\n" * 11 + '{"partial')
    write_json(tmp_path / "error-rank1.json", _error("Stalled").__dict__)
    r = restart_for(tmp_path, "rank 1 stalled\nmore", 1, nodes=2, started=900.0)
    assert (r.attempt, r.rank, r.host, r.failed_at_step, r.resumed_from, r.steps_redone) == (
        1,
        1,
        "n1",
        11,
        8,
        3,
    )
    assert r.node_hours_lost == pytest.approx(2 * (r.time - 1100.0) / 3600)
    assert r.describe().startswith(
        "restart 1: rank 1 on n1: rank 1 stalled; resumed from step 8, 3 step(s) redone"
    )
    set_aside(tmp_path)
    assert not (tmp_path / "error-rank1.json").exists() and (tmp_path / "error-rank1.json.1").exists()
    record(tmp_path, r)
    with open(tmp_path / RESTARTS, "a") as f:
        f.write('{"attempt": 2, "trunc')  # a writer killed mid-line
    assert read_restarts(tmp_path) == [r]


def test_a_restart_needs_restarts_left_and_a_failure_it_can_outlive(tmp_path: Path) -> None:
    assert why_not(tmp_path, 2, 0) is None  # no error file: a killed rank
    assert why_not(tmp_path, 2, 2) == "not restarted: 2 restart(s) used of train.max_restarts=2"
    write_json(tmp_path / "error-rank0.json", _error("TypeError", rank=0).__dict__)
    assert "rank 0 raised TypeError" in str(why_not(tmp_path, 2, 0))


def test_a_negative_max_restarts_is_refused() -> None:
    with pytest.raises(ConfigError, match="train.max_restarts"):
        validate(load_config(["train.max_restarts=-1"]))
    assert Restart(1, 0.0, "x", None, None, 5, 0, 1, 3600.0).describe() == (
        "restart 1: x; resumed from step 0, 5 step(s) redone, 1.0000 node-h lost"
    )


def test_a_slurm_restart_starts_the_step_submitit_starts_and_keeps_the_job_s_status(tmp_path: Path) -> None:
    import shlex

    from hpctrain.launch.slurm import restart
    from hpctrain.launch.slurm.plan import plan_slurm

    cfg = load_config(["cluster=slurm", "cluster.nodes=2", "train.max_restarts=2"])
    plan = plan_slurm(cfg, str(tmp_path / "run dir"), "/opt/py env/bin/python")
    for array in (None, 3):
        script = plan.sbatch_script(array)
        srun = next(line for line in script.splitlines() if line.startswith("srun "))
        mine = restart.srun_argv(plan.to_dict(), plan.folder, array is not None)
        assert [a for a in mine if a != "--open-mode=append"] == shlex.split(srun)
    # the teardown runs on the host after srun, quoted, and its status is the script's
    assert script.rstrip().splitlines()[-2:] == [
        "hpctrain_status=$?",
        f"[ \"$hpctrain_status\" = 0 ] || '/opt/py env/bin/python' -m hpctrain.launch.slurm.restart "
        f"'{plan.folder}' \"$hpctrain_status\"",
    ]
    run = tmp_path / "r"
    run.mkdir()
    assert restart.why_not(run, 2, 0, State.RUNNING) is None
    assert (
        restart.why_not(run, 2, 2, State.RUNNING)
        == "not restarted: 2 restart(s) used of train.max_restarts=2"
    )
    assert restart.why_not(run, 2, 0, State.CANCELLED) == "not restarted: the job is CANCELLED"
    assert restart.why_not(run, 2, 0, State.of("REQUEUED")) == "not restarted: the job is REQUEUED"
    # scontrol had no answer (a busy slurmctld): restart; a job that ended takes the step with it
    assert restart.why_not(run, 2, 0, State.of("")) is None


def test_a_tracked_run_carries_its_restarts_and_excluded_nodes(tmp_path: Path) -> None:
    import dataclasses
    import json

    from hpctrain import records
    from hpctrain.bench.analyze import synthetic_summary
    from hpctrain.tracking.source import summary_metrics

    s = synthetic_summary(2, 64, step=0.05, compute=0.04, comm=0.005, data=0.005)
    records.write(tmp_path / records.SUMMARY, dataclasses.replace(s, restarts=2, steps_redone=5))
    (tmp_path / "preflight.json").write_text(json.dumps({"verdicts": [{"host": "n2", "bad": True}]}) + "\n")
    assert "nodes_lost" not in summary_metrics(tmp_path)
    record(tmp_path, Restart(1, 0.0, "x", 1, "n3", 5, 4, 2, 1.0, ["n3"], "went on with 2 -> 1 ranks"))
    m = summary_metrics(tmp_path)
    assert (m["restarts"], m["steps_redone"], m["nodes_excluded"], m["nodes_lost"]) == (2, 5, 1, 1)
    records.write(tmp_path / records.SUMMARY, s)
    (tmp_path / "preflight.json").unlink()
    (tmp_path / RESTARTS).unlink()
    assert "restarts" not in summary_metrics(tmp_path) and "nodes_excluded" not in summary_metrics(tmp_path)


def test_the_slurm_teardown_keeps_the_step_s_status_when_it_cannot_look(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from hpctrain.launch.slurm.restart import checked

    monkeypatch.setenv("SLURM_JOB_ID", "77")  # no pickle of job 77 in this folder
    assert checked([str(tmp_path), "137"]) == 137
    assert checked([str(tmp_path), "0"]) == 0
    err = capsys.readouterr().err
    assert err.startswith("hpctrain: no restart tried: FileNotFoundError: ") and "Traceback" not in err


def test_progress_between_two_attempts_is_the_set_aside_attempts(tmp_path: Path) -> None:
    """Round 5, class 10: a supervisor killed mid-restart left status showing progress `-`: rank
    0's step records were set aside (steps-rank0.jsonl.1) and the next attempt had none yet."""
    from hpctrain import records
    from hpctrain.orchestrate.progress import progress_of
    from hpctrain.records.restarts import Restart, record
    from tests.unit.test_records import STEP

    (tmp_path / "steps-rank0.jsonl.1").write_text(records.step_line(STEP) * 2)
    record(tmp_path, Restart(1, 0.0, "rank 1: killed by signal 9", 1, "vm", 4, 2, 1, 0.5))
    said = f"step {STEP.step + 1}, {STEP.samples_per_s:.1f} samples/s, 1 restart"
    assert progress_of(tmp_path) == said
    (tmp_path / "steps-rank0.jsonl").write_text("")  # the new attempt's, empty so far
    assert progress_of(tmp_path).startswith(f"step {STEP.step + 1},")
    assert progress_of(tmp_path / "none") == "-"


def test_a_start_that_died_of_a_segfault_before_the_ranks_met_is_retried_once(tmp_path: Path) -> None:
    """launch/slurm/restart.py:start_fault: a task killed by SIGSEGV/SIGBUS (srun's words) while no
    rank wrote an error or a step and the ranks had not met (env.json without the hosts, or a
    script's in its first minute); once per run; anything else is a failure as before."""
    from hpctrain.launch.slurm.restart import start_fault

    run = tmp_path / "r"
    run.mkdir()
    said = "srun: error: n1: task 0: Segmentation fault (core dumped)\nsrun: error: n2: task 1: Terminated\n"
    assert start_fault(run, said, []) == (0, "killed by signal 11 (SIGSEGV) on n1 before the ranks met")
    assert start_fault(run, said.replace("Segmentation fault (core dumped)", "Bus error"), []) is not None
    assert start_fault(run, said.replace("Segmentation fault (core dumped)", "Killed"), []) is None
    assert start_fault(run, "srun: error: n1: task 0: Exited with exit code 1\n", []) is None
    retried = Restart(1, 1.0, "killed by signal 11", 0, None, 0, 0, 2, 1.0, start=True)
    assert start_fault(run, said, [retried]) is None  # once
    assert "start retried: rank 0: killed by signal 11; started again once" in retried.describe()
    (run / "env.json").write_text('{"hosts": ["n1", "n2"]}')  # the ranks met: a segfault now is the run's own
    assert start_fault(run, said, []) is None
    (run / "env.json").write_text('{"hosts": ')  # damaged: taken as written
    assert start_fault(run, said, []) is None
    # a script's rank 0 writes env.json before the script meets (hvd.init): its first minute is its start
    (run / "env.json").write_text('{"script": {"path": "train.py", "args": []}}')
    assert start_fault(run, said, []) == (
        0,
        "killed by signal 11 (SIGSEGV) on n1 before the script's first step",
    )
    an_hour_ago = time.time() - 3600
    os.utime(run / "env.json", (an_hour_ago, an_hour_ago))
    assert start_fault(run, said, []) is None
    (run / "env.json").unlink()
    write_json(run / "error-rank1.json", _error("ValueError").__dict__)
    assert start_fault(run, said, []) is None


def test_a_retried_start_is_not_counted_against_max_restarts(tmp_path: Path) -> None:
    from hpctrain.records.restarts import counted

    done = [
        Restart(1, 1.0, "segv", 0, None, 0, 0, 2, 1.0, start=True),
        Restart(2, 2.0, "killed", 1, None, 6, 4, 2, 1.0),
    ]
    assert counted(done) == done[1:]
    record(tmp_path, done[0])
    assert read_restarts(tmp_path)[0].start and not Restart(**{**done[1].__dict__}).start


def test_a_supervisor_killed_mid_restart_is_failed_as_of_its_last_sign_of_life(tmp_path: Path) -> None:
    """Round 5, class 10: a supervisor SIGKILLed mid-restart showed elapsed 00:00:00 (the restart
    had rewritten state.json at its start; the end was taken from it). The end is now the newest
    of the state, the launcher log and rank 0's steps, and stays so for every later status."""
    import json
    import time

    from hpctrain import records
    from hpctrain.launch.base import Job
    from hpctrain.launch.local.launcher import LocalLauncher

    now = time.time()
    state = {"format_version": 1, "state": "RUNNING", "started": now - 100, "updated": now - 99}
    (tmp_path / records.STATE).write_text(json.dumps(state))
    log = tmp_path / records.LAUNCHER_LOG
    log.parent.mkdir()
    log.write_text("hpctrain: restart 1: ...\n")
    os.utime(log, (now - 10, now - 10))
    ref = records.JobRef(1, "local", "local-1", 2, pid=None)
    for _ in range(2):  # the first look records it; the second reads what was recorded
        [st] = LocalLauncher().status([Job(tmp_path, ref)]).values()
        assert (st.state, st.elapsed) == ("FAILED", "00:01:30"), st


def test_status_reports_the_throughput_the_summary_and_the_sweep_table_report(tmp_path: Path) -> None:
    """A sweep point once showed 228.6 samples/s in the sweep table (the summary's mean) and 2,681
    in status (its last step's). Now: the mean of the timed steps (batch x steps / their time),
    from the summary once there is one; a warm-up step is said to be one."""
    import dataclasses

    from hpctrain import records
    from hpctrain.orchestrate.progress import progress_of
    from tests.unit.test_records import STEP

    def step(k: int, step_s: float, timed: bool = True) -> records.StepRecord:
        return dataclasses.replace(STEP, step=k, step_s=step_s, samples_per_s=64 / step_s, timed=timed)

    (tmp_path / "steps-rank0.jsonl").write_text(records.step_line(step(0, 1.0, timed=False)))
    assert progress_of(tmp_path) == "step 1, 64.0 samples/s (warm-up)"
    # timed steps of 0.1 s and 0.3 s: 64 x 2 / 0.4 s = 320 samples/s (not the last step's 213.3)
    (tmp_path / "steps-rank0.jsonl").write_text(
        "".join(records.step_line(step(k, t)) for k, t in ((1, 0.1), (2, 0.3)))
    )
    assert progress_of(tmp_path) == "step 3, 320.0 samples/s"
    from hpctrain.bench.analyze import synthetic_summary
    from tests.conftest import replace_summary

    summary = replace_summary(
        synthetic_summary(1, 64, 0.2, 0.2, 0.0, 0.0, 1000, "ddp"), throughput_samples_per_s=301.25
    )
    records.write(tmp_path / records.SUMMARY, summary)
    assert progress_of(tmp_path) == "step 3, 301.2 samples/s"
