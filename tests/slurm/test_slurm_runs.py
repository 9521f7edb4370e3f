"""Real SLURM jobs on the local cluster: multi-node Horovod, sweeps as arrays, requeue, failures."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
import torch

from tests.conftest import (
    DIGITS_CNN,
    HOROVOD_IDLE,
    SLURM_VERSION,
    SlurmCluster,
    assert_same_weights,
    hpctrain,
    recorded_steps,
    run_ok,
    sacct_state,
    signal_at_step,
    start_run,
    wait_done,
    wait_for,
    weights,
)
from tests.mpi.test_study import check_report_against_the_run_records

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_cluster")]

BASE = ["data=digits", "model=cnn", "train.steps=12", "train.warmup_steps=2", "train.log_interval=4"]


@pytest.mark.slurm_versions
def test_two_nodes_two_ranks_each_match_the_local_run(tmp_path: Path, one_rank_reference) -> None:
    slurm_dir, s = run_ok(
        tmp_path,
        "slurm",
        *BASE,
        "cluster=slurm",
        "cluster.nodes=2",
        "cluster.ranks_per_node=2",
        "train.batch_per_rank=8",
        "cluster.checkpoint_interval=5",
    )
    assert s["world_size"] == 4
    # periodic checkpoints after steps 5 and 10 of 12 (none after the last step: the run is done)
    assert sorted(p.name for p in (slurm_dir / "checkpoints").glob("step-*.pt")) == [
        "step-000005.pt",
        "step-000010.pt",
    ]
    assert (slurm_dir / "checkpoints" / "latest").read_text().strip() == "step-000010.pt"
    env = json.loads((slurm_dir / "env.json").read_text())
    # ranks on two different host names, two each (which two nodes is the scheduler's choice:
    # a just-cancelled job's nodes may still be completing)
    hosts = sorted(set(env["hosts"]))
    assert len(hosts) == 2 and set(hosts) <= {"n1", "n2", "n3", "n4"}, env["hosts"]
    assert [env["hosts"].count(h) for h in hosts] == [2, 2] and env["launcher"]["SLURM_NNODES"] == "2"
    assert env["slurm"].startswith(SLURM_VERSION + "."), env["slurm"]  # the version the job ran under
    # the same global batch of 32 on one local rank (BASE is conftest.DIGITS_CNN): 4 ranks on 2
    # nodes equal it, as a local run of 4 ranks does
    local_dir, _ = one_rank_reference
    assert BASE == DIGITS_CNN
    assert_same_weights(slurm_dir, local_dir, rtol=1e-5, atol=1e-6)
    # its cost, from SLURM's accounting once the job ended: 2 nodes x the job's elapsed time
    job = json.loads((slurm_dir / "job.json").read_text())["job_id"]
    acct = subprocess.run(
        ["sacct", "-j", job, "-X", "-n", "-P", "-o", "ElapsedRaw,AllocCPUS"], capture_output=True, text=True
    ).stdout.split("|")
    assert s["cost_source"] == "sacct" and s["energy_j"] is None  # no energy plugin: not measured, not 0
    assert s["node_hours"] == pytest.approx(2 * int(acct[0]) / 3600)
    assert s["core_hours"] == pytest.approx(int(acct[1]) * int(acct[0]) / 3600)
    # its 4 tasks were forked warm (tests/warm), on 24.11's nodes by the zygote inside their root:
    # a regression there fails nothing else, it only costs minutes of every run
    if zygote := os.environ.get("HPCTRAIN_TEST_ZYGOTE"):
        which = f"{zygote}.rooted" if SLURM_VERSION != "22.05" else zygote
        served = Path(f"{which}.served").read_text().splitlines()
        assert served.count(f"-u -m submitit.core._submit {slurm_dir / 'submitit'}") == 4, served


def test_sweep_groups_points_into_one_array_per_shape(tmp_path: Path) -> None:
    r = hpctrain(
        "run",
        "-m",
        "--no-progress",
        "cluster=slurm",
        "cluster.nodes=1,2",
        "cluster.ranks_per_node=1",
        "precision=fp32,bf16,fp16",
        *BASE[:1],
        "train.steps=6",
        "train.warmup_steps=1",
        f"run.output_root={tmp_path}",
        "run.name=sw",
        timeout=900,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    [sweep_dir] = list(tmp_path.glob("*/*-sw-sweep"))
    manifest = json.loads((sweep_dir / "sweep.json").read_text())
    assert len(manifest["runs"]) == 6
    assert len(manifest["arrays"]) == 2  # exactly two sbatch calls: one array per node count
    assert sorted(a["size"] for a in manifest["arrays"]) == [3, 3]
    for run in manifest["runs"]:
        assert run["job_id"].split("_")[0] in {a["array_id"] for a in manifest["arrays"]}
        assert sacct_state(run["job_id"]) == "COMPLETED"
        summary = json.loads((Path(run["run_dir"]) / "summary.json").read_text())
        nodes = int(next(o for o in run["overrides"] if o.startswith("cluster.nodes=")).split("=")[1])
        assert summary["world_size"] == nodes
    status = hpctrain("status", str(sweep_dir))
    assert status.returncode == 0 and status.stdout.count("COMPLETED") == 6
    # counts first; what all points share once (not in each row); per row what varies
    lines = status.stdout.splitlines()
    assert lines[0] == "6 runs: 6 completed"
    common = next(line for line in lines if line.startswith("common to every run: "))
    assert "train.steps=6" in common and "cluster.ranks_per_node=1" in common
    assert status.stdout.count("train.steps=6") == 1 and status.stdout.count("precision=bf16") == 2


_wait_done, _recorded_steps = wait_done, recorded_steps


@pytest.mark.slurm_versions
def test_a_real_time_limit_requeues_up_to_max_requeues(slurm_cluster: SlurmCluster) -> None:
    """SLURM's own time limit (2 minutes, SIGUSR2 60 s before it), not a hand-sent signal. Both
    jobs hold at step 5 until the signal. With max_requeues=1 the job checkpoints, is requeued
    and finishes; with max_requeues=0 it checkpoints and stops, and says so and how to go on.
    The jobs (conftest.TIME_LIMIT) were submitted when the cluster started."""
    dirs = {n: d for n, (d, _) in slurm_cluster.time_limit_runs.items()}
    jobs = {n: job for n, (_, job) in slurm_cluster.time_limit_runs.items()}

    assert _wait_done(jobs[1]) == "COMPLETED"
    log = hpctrain("logs", str(dirs[1])).stdout
    assert "checkpoint step-000006.pt written after step 6" in log and "at step 6" in log, log
    assert _recorded_steps(dirs[1], 0) == list(range(20))
    assert json.loads((dirs[1] / "summary.json").read_text())["timed_steps"] == 18

    assert _wait_done(jobs[0]) == "FAILED"
    assert _recorded_steps(dirs[0], 0) == list(range(6))
    status = hpctrain("status", str(dirs[0])).stdout
    assert "not requeued" in status and "cluster.max_requeues=0" in status, status
    assert "step-000006.pt holds the state to resume from" in status, status


def test_failed_rank_is_reported_by_run_and_status(tmp_path: Path) -> None:
    run_dir = tmp_path / "fail"
    r = hpctrain(
        "run",
        "--no-progress",
        f"run.dir={run_dir}",
        *BASE,
        "train.steps=200",
        "cluster=slurm",
        "cluster.nodes=2",
        "cluster.ranks_per_node=1",
        "debug.fail_rank=1",
        "debug.fail_step=3",
        timeout=300,
    )
    assert r.returncode == 4, r.stdout + r.stderr
    assert "rank 1 failed" in r.stderr and "InjectedFailure" in r.stderr
    status = hpctrain("status", str(run_dir), timeout=60)
    assert "FAILED" in status.stdout and "InjectedFailure" in status.stdout, status.stdout


def test_a_killed_rank_restarts_as_a_new_job_step_in_the_same_allocation(
    tmp_path: Path, one_rank_reference: tuple[Path, dict]
) -> None:
    """2 nodes x 1 rank, rank 1 killed at step 6 of the first attempt, checkpoints every 4 steps:
    srun ends the step (--kill-on-bad-exit), the batch script's teardown starts it again on the
    same nodes, which resume at step 4 and end equal to one rank with the global batch."""
    from hpctrain.records.restarts import read_restarts

    run_dir, s = run_ok(
        tmp_path, "restart", *BASE, "cluster=slurm", "cluster.nodes=2", "cluster.ranks_per_node=1",
        "train.batch_per_rank=16", "cluster.checkpoint_interval=4", "train.max_restarts=1",
        "debug.fail_rank=1", "debug.fail_step=6", "debug.fail_mode=kill",
    )  # fmt: skip
    assert_same_weights(run_dir, one_rank_reference[0], rtol=1e-5, atol=1e-6)
    [restart] = read_restarts(run_dir)
    assert (restart.attempt, restart.rank, restart.failed_at_step, restart.resumed_from) == (1, 1, 6, 4)
    assert restart.nodes == 2 and restart.cause.startswith("killed by signal 9 (SIGKILL) on n"), restart
    assert (s["restarts"], s["steps_redone"]) == (1, 2), s
    job = json.loads((run_dir / "job.json").read_text())["job_id"]
    acct = dict(
        line.split("|", 1)
        for line in subprocess.run(
            ["sacct", "-j", job, "-n", "-P", "-o", "JobID,State"], capture_output=True, text=True
        ).stdout.splitlines()
    )
    # two srun steps of one allocation: the one srun ended when rank 1 died, and its restart; the
    # job itself never left its nodes (no requeue)
    assert acct[f"{job}.0"].startswith(("CANCELLED", "FAILED")) and acct[f"{job}.1"] == "COMPLETED", acct
    assert acct[job] == "COMPLETED" and f"{job}.2" not in acct, acct
    status = hpctrain("status", str(run_dir), timeout=60).stdout
    assert "1 restart" in status and "restart 1: rank 1: killed by signal 9" in status, status


def test_a_start_that_segfaults_before_the_ranks_meet_is_retried_once_and_recorded(tmp_path: Path) -> None:
    """Rank 0 dies of SIGSEGV before the ranks meet on the first attempt (as Open MPI's PMIx start
    under srun --mpi=pmix does now and then): with train.max_restarts=0 the teardown starts it
    again once, names it, and counts it apart from the restarts."""
    from hpctrain.records.restarts import read_restarts

    run_dir, s = run_ok(
        tmp_path, "startfault", *BASE, "train.steps=4", "train.warmup_steps=1", "cluster=slurm",
        "cluster.nodes=2", "cluster.ranks_per_node=1", "train.batch_per_rank=16",
        "debug.fail_rank=0", "debug.fail_mode=start_segfault",
    )  # fmt: skip
    [retry] = read_restarts(run_dir)
    assert retry.start and retry.rank == 0 and retry.failed_at_step == 0, retry
    assert (
        retry.cause.startswith("killed by signal 11 (SIGSEGV) on n") and "before the ranks met" in retry.cause
    )
    assert (s["restarts"], s["start_retries"], s["timed_steps"]) == (0, 1, 3), s
    status = hpctrain("status", str(run_dir), timeout=60).stdout
    assert "start retried: rank 0: killed by signal 11 (SIGSEGV) on n" in status, status
    assert "samples/s, start retried" in status and "1 restart" not in status, status


def _evidence(run_dir: Path, job: str) -> str:
    """What a run that ended otherwise than expected left: the job's accounting records, the
    pre-flight checks, the ranks' errors and the tails of the batch jobs' logs (CI saw the
    re-submitted job FAILED once, with nothing to say why)."""
    said = [subprocess.run(["sacct", "-j", job, "-P", "-o", "JobID,State,ExitCode,Submit,NodeList"],
                           capture_output=True, text=True).stdout]  # fmt: skip
    said += [p.read_text(errors="replace") for p in sorted(run_dir.glob("preflight.json"))]
    said += [p.read_text(errors="replace") for p in sorted(run_dir.glob("error-rank*.json*"))]
    said += [p.read_text(errors="replace")[-1500:] for p in sorted(run_dir.glob("submitit/*_log.*"))]
    return "\n".join(said)


@pytest.mark.slurm_versions
def test_a_slow_node_fails_the_pre_flight_check_and_the_run_completes_without_it(tmp_path: Path) -> None:
    """n2 is slow (its GEMMs take 50x as long): the job's check judges it bad before any step, and
    the run goes again without it, submitted with --no-wait (nothing waits for it): the job's own
    batch script submits it again excluding n2, and the new job checks good nodes and completes."""
    run_dir = tmp_path / "preflight"
    job = start_run(
        run_dir, *BASE, "train.steps=4", "train.warmup_steps=1", "cluster=slurm",
        "cluster.nodes=2", "cluster.ranks_per_node=1", "cluster.nodelist=[n1,n2]", "debug.slow_node=n2",
        "cluster.preflight.enabled=true", "cluster.preflight.tolerance=0.7",
    )  # fmt: skip
    assert wait_done(job) == "FAILED"  # before any step; its teardown submitted the run again
    again = json.loads((run_dir / "job.json").read_text())["job_id"]
    assert again != job and wait_done(again) == "COMPLETED", _evidence(run_dir, again)
    s = json.loads((run_dir / "summary.json").read_text())
    checks = [json.loads(line) for line in (run_dir / "preflight.json").read_text().splitlines()]
    assert [[v["host"] for v in c["verdicts"] if v["bad"]] for c in checks] == [["n2"], []], checks
    assert "compute" in checks[0]["verdicts"][1]["why"] and checks[0]["links_measured"], checks[0]
    hosts = json.loads((run_dir / "env.json").read_text())["hosts"]
    assert "n1" in hosts and "n2" not in hosts and s["timed_steps"] == 3, hosts
    assert s["nodes_excluded"] == ["n2"] and s["nodes_lost"] == [], s
    cfg = (run_dir / "config.yaml").read_text()
    assert "exclude:\n  - n2" in cfg and "nodelist:\n  - n1\n" in cfg, cfg
    assert list(run_dir.glob("error-rank*.json.1")), "the first attempt's errors are kept aside"
    status = hpctrain("status", str(run_dir), timeout=60).stdout
    assert "pre-flight check 1: n1 good; n2 BAD (compute" in status and "pre-flight check 2:" in status, (
        status
    )


@pytest.mark.slurm_versions
def test_slurm_study_submits_arrays_and_its_analysis_as_a_job_after_them(tmp_path: Path) -> None:
    """--analyze-as-job: the points and the allreduce benchmark as job arrays, one per shape, and
    the analysis as a job SLURM holds until they have all ended (--dependency=afterany); the
    report it writes is the one `hpctrain study` would have written waiting."""
    r = hpctrain(
        "study",
        "weak",
        "--analyze-as-job",
        "cluster=slurm",
        "cluster.ranks_per_node=1",
        "study.nodes=[1,2]",
        "study.repetitions=2",
        "study.steps=6",
        "study.warmup_steps=1",
        "study.batch_per_rank=16",
        "study.allreduce_max_mb=1",
        "data=digits",
        f"run.output_root={tmp_path}",
        "run.name=ss",
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    ids = r.stdout.split("allreduce benchmark(s): jobs ")[1].split("\n")[0].split()
    assert "submitted 4 run(s) and 1 allreduce benchmark(s)" in r.stdout, r.stdout
    assert len({i.split("_")[0] for i in ids}) == 2, ids  # one array per node count
    analysis = r.stdout.split("the analysis is job ")[1].split(",")[0]
    assert wait_done(analysis, 300) == "COMPLETED"
    [study] = list(tmp_path.glob("*/*-ss-weak"))
    out = subprocess.run(
        ["sacct", "-n", "-P", "-X", "-o", "JobID,Start,End", "-j", ",".join([*ids, analysis])],
        capture_output=True,
        text=True,
    ).stdout
    times = {line.split("|")[0]: line.split("|")[1:] for line in out.splitlines()}
    assert times[analysis][0] >= max(times[i][1] for i in ids), times  # ISO times: ordered as text
    worlds = sorted(
        json.loads((study / f"n{n}-r{k}" / "summary.json").read_text())["world_size"]
        for n in (1, 2)
        for k in (0, 1)
    )
    assert worlds == [1, 1, 2, 2]
    assert json.loads((study / "n2-r0" / "summary.json").read_text())["cost_source"] == "sacct"
    bench = json.loads((study / "allreduce-n2.json").read_text())  # measured inside a 2-node job
    assert bench["n"] == 2 and bench["rows"][-1]["bytes"] == 2**20
    printed = hpctrain("logs", str(study / "analysis")).stdout
    check_report_against_the_run_records(study, printed, kind="weak")
    status = hpctrain("status", str(study)).stdout
    assert "6 runs: 6 completed" in status, status

    # An interrupted study: one run never finished. Resume submits only that one, as a SLURM job.
    (study / "n2-r1" / "summary.json").unlink()
    r = hpctrain("study", "resume", str(study), "--no-progress", timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "3 run(s) already finished; running the other 1" in r.stdout, r.stdout
    assert "submitted 1 run(s) as 1 job array(s)" in r.stdout, r.stdout
    assert json.loads((study / "n2-r1" / "summary.json").read_text())["world_size"] == 2
    assert len(list(study.glob("n2-r1.failed-*"))) == 1  # the unfinished attempt is kept aside


def test_bench_submit_sends_a_sweep_in_one_sbatch_call(tmp_path: Path) -> None:
    r = hpctrain("bench", "submit", "--points", "16", "4", "--out", str(tmp_path), timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "1 sbatch call(s) for 16 points" in r.stdout, r.stdout
    # submitting asked the limits once and sbatch once; `hpctrain status` of the 16 runs asked the
    # controller once (squeue) and accounting only if some had already left the queue
    assert re.search(
        r"│ +16 │ +1 │ +1 \(target 1\) │.*│ 1 sbatch, 1 squeue, 1 scontrol, 2 sacctmgr, 1 sinfo = 6 │ "
        r"1 squeue(, 1 sacct)? = [12] │",
        r.stdout,
    ), r.stdout
    # the hour's wait on a fake clock: accounting asked a dozen times (every 5 minutes and at the
    # end) and reading far fewer records than asking it at every look (16 tasks: 97 looks)
    waits = {
        way: (int(sacct), int(rows.replace(",", "")))
        for way, sacct, rows in re.findall(
            r"│ +(hpctrain|sacct at every look) │ +\d+ │ [^│]*?(\d+) sacct[^│]*│ +([\d,]+) │", r.stdout
        )
    }
    assert waits["hpctrain"] == (12, 12 * 16) and waits["sacct at every look"][1] > 5 * 12 * 16, r.stdout
    [sweep] = [
        s
        for s in tmp_path.glob("*/*-submit-sweep*")
        if len(json.loads((s / "sweep.json").read_text())["runs"]) == 16
    ]
    manifest = json.loads((sweep / "sweep.json").read_text())
    assert len(manifest["runs"]) == 16 and len(manifest["arrays"]) == 1

    # the bench cancels what it submitted: every task is CANCELLED (or ran before the cancel),
    # including the tasks that never started and so have no accounting record of their own (once
    # slurmdbd has recorded the cancel: tasks that started out of order split the array's record)
    def ended() -> str:
        status = hpctrain("status", str(sweep), timeout=60).stdout
        return status if "PENDING" not in status and "RUNNING" not in status else ""

    wait_for("every task of the sweep ended in accounting", ended, timeout_s=60)
    status = ended()
    assert status.count("CANCELLED") + status.count("COMPLETED") == 16, status


@pytest.mark.slurm_versions
def test_a_sweep_larger_than_max_array_size_goes_out_as_several_arrays(tmp_path: Path) -> None:
    """The local cluster keeps SLURM's default MaxArraySize=1001 (indices 0..1000)."""
    assert (
        "MaxArraySize            = 1001"
        in subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True).stdout
    )
    r = hpctrain("bench", "submit", "--points", "1003", "--out", str(tmp_path), timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "2 sbatch call(s) for 1003 points" in r.stdout and "target of 2" in r.stdout, r.stdout
    [sweep] = list(tmp_path.glob("*/*-submit-sweep"))
    manifest = json.loads((sweep / "sweep.json").read_text())
    assert [a["size"] for a in manifest["arrays"]] == [1001, 2], manifest["arrays"]
    tasks = [int(run["job_id"].split("_")[1]) for run in manifest["runs"]]
    assert tasks == [*range(1001), 0, 1]  # each array's own indices, from 0


def test_a_requeued_task_of_a_job_array_resumes_bit_identically(tmp_path: Path) -> None:
    """What SLURM sends before the time limit, mid-run: no step lost or repeated, the same weights
    as the uninterrupted run, bit for bit. A sweep is one array from one pickle (each task's name a
    hard link to it): task 0 (2 nodes) holds at step 4 and is signalled, checkpoints and is
    requeued as its own TrainingJob; task 1, the same training without the hold, runs straight
    through."""
    from tests.conftest import MLP

    r = hpctrain(
        "run", "-m", "--no-wait", *MLP, "cluster=slurm", "cluster.nodes=2", "cluster.ranks_per_node=1",
        "debug.hold_step=4,null", f"run.output_root={tmp_path}", "run.name=arr",
        HOROVOD_IDLE,  # the ranks held
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    [sweep] = list(tmp_path.glob("*/*-arr-sweep"))
    held, straight = sweep / "0", sweep / "1"
    job = signal_at_step(held, 4)  # both ranks wait at step 4 until the signal: it arrives mid-run
    assert job.endswith("_0") and _wait_done(job) == "COMPLETED"
    other = json.loads((straight / "job.json").read_text())["job_id"]
    assert _wait_done(other) == "COMPLETED"
    log = hpctrain("logs", str(held)).stdout
    # the ranks agreed to stop after step 4 (the first step after the signal): resume at 5
    assert "checkpoint step-000005.pt written after step 5" in log, log
    assert f"resuming from {held / 'checkpoints' / 'step-000005.pt'} at step 5" in log, log
    for rank in (0, 1):
        assert _recorded_steps(held, rank) == list(range(8))  # no step lost, none repeated
    a, b = weights(held), weights(straight)
    assert all(torch.equal(a[k], b[k]) for k in a), "the requeued task's weights differ"
    from submitit.core.utils import DelayedSubmission

    from hpctrain.launch.slurm.job import ArrayTask, TrainingJob

    pickles = {
        i: DelayedSubmission.load(sweep / "submitit" / f"{job.split('_')[0]}_{i}_submitted.pkl")
        for i in (0, 1)
    }
    assert isinstance(pickles[1].function, ArrayTask)  # the array's one pickle, under task 1's name
    requeued = pickles[0].function  # task 0's checkpoint: its own training, under its own name
    assert isinstance(requeued, TrainingJob) and requeued.run_dir == str(held)
