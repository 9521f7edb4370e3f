"""Concurrent use: two runs started in the same second both run, in distinct directories; one
study, and one tune, is run by one hpctrain at a time; study resume stays inside the study directory."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest

from hpctrain.orchestrate import runs as orchestrate
from tests.conftest import hpctrain, hpctrain_here, start_hpctrain, wait_for

pytestmark = [
    pytest.mark.mpi,
    pytest.mark.side_stream,
]  # mostly starts, stops and reads runs: beside the SLURM stream

SMALL = ["data=digits", "train.steps=6", "train.warmup_steps=1", "train.batch_per_rank=16"]


def test_two_runs_started_in_the_same_second_both_run(tmp_path: Path) -> None:
    now = datetime(2026, 1, 2, 3, 4, 5)
    args = [*SMALL, f"run.output_root={tmp_path}", "run.name=same"]
    first, second = (orchestrate.prepare(args, now=now) for _ in range(2))
    assert first.runs[0].run_dir == second.runs[0].run_dir  # planned alike: the same second
    jobs = [orchestrate.start(p, detach=True)[0] for p in (first, second)]
    dirs = [j.run_dir for j in jobs]
    assert [d.name for d in dirs] == ["03-04-05-same", "03-04-05-same-2"]
    plan = json.loads((dirs[1] / "plan.json").read_text())
    assert plan["run_dir"] == str(dirs[1])  # planned again for the directory it got
    states = first.launcher.wait(jobs, timeout_s=300)
    assert [states[j.job_id].state for j in jobs] == ["COMPLETED", "COMPLETED"]
    assert all((d / "summary.json").exists() for d in dirs)


def _study(tmp_path: Path, *extra: str) -> list[str]:
    return [
        "study",
        "strong",
        "study.ranks=[1]",
        "study.repetitions=1",
        "study.global_batch=16",
        "study.warmup_steps=1",
        "study.allreduce_bench=false",
        "data=digits",
        "--no-progress",
        f"run.output_root={tmp_path}",
        *extra,
    ]


def test_a_second_resume_of_a_running_study_is_refused_and_disturbs_nothing(tmp_path: Path) -> None:
    proc = start_hpctrain(*_study(tmp_path, "study.steps=3000"))
    try:
        wait_for(
            "the study's run to start", lambda: list(tmp_path.glob("*/*-strong/n1-r0/steps-rank0.jsonl"))
        )
        [study] = list(tmp_path.glob("*/*-strong"))
        before = sorted(p.name for p in study.iterdir())
        r = hpctrain("study", "resume", str(study), timeout=120)
        assert r.returncode == 1, r.stdout + r.stderr
        assert f"study {study} is being run by another hpctrain (pid {proc.pid})" in r.stderr, r.stderr
        assert sorted(p.name for p in study.iterdir()) == before  # nothing renamed or added
        assert "n1-r0" in before and proc.poll() is None  # the first one's run goes on
    finally:
        proc.terminate()
        proc.communicate(timeout=60)
    assert proc.returncode == 130


def test_a_second_resume_of_a_running_tune_is_refused_and_disturbs_nothing(tmp_path: Path) -> None:
    """Round 5, class 2: `tune --resume` of a tune still running set its trials aside and ran
    trials beside them; tune.json and best.yaml ended as the second's."""
    home = tmp_path / "tune"
    tune = [*SMALL, "train.steps=3000", "parallelism.engine=ddp", "tune.keys=[parallelism.compression]"]
    proc = start_hpctrain("tune", *tune, f"run.dir={home}")
    try:
        wait_for("the tune's first trial to start", lambda: (home / "trial-0" / "steps-rank0.jsonl").exists())
        before = sorted(p.name for p in home.iterdir())
        r = hpctrain("tune", "--resume", str(home), timeout=120)
        assert r.returncode == 1, r.stdout + r.stderr
        assert f"tune {home} is being run by another hpctrain (pid {proc.pid})" in r.stderr, r.stderr
        assert f"then: hpctrain tune --resume {home}" in r.stderr
        assert sorted(p.name for p in home.iterdir()) == before  # no trial set aside, none added
        assert proc.poll() is None  # the first tune goes on
    finally:
        proc.terminate()
        proc.communicate(timeout=60)


def test_resume_never_writes_outside_the_study_whatever_study_json_says(tmp_path: Path) -> None:
    r = hpctrain(*_study(tmp_path, "study.steps=4"), timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    [study] = list(tmp_path.glob("*/*-strong"))
    manifest = json.loads((study / "study.json").read_text())
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "precious").write_text("keep me")
    manifest["runs"][0]["run_dir"] = str(outside)
    (study / "study.json").write_text(json.dumps(manifest))
    r = hpctrain("study", "resume", str(study), timeout=120)
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"run 'n1-r0' has run_dir '{outside}'" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert [p.name for p in outside.iterdir()] == ["precious"] and (study / "n1-r0" / "summary.json").exists()


def test_resume_validates_every_run_again_before_touching_anything(tmp_path: Path) -> None:
    r = hpctrain(*_study(tmp_path, "study.steps=4"), timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    [study] = list(tmp_path.glob("*/*-strong"))
    manifest = json.loads((study / "study.json").read_text())
    manifest["runs"][0]["overrides"].append("train.steps=0")  # edited, or a rule that changed since
    (study / "study.json").write_text(json.dumps(manifest))
    (study / "n1-r0" / "summary.json").unlink()  # so that it is pending
    before = sorted(p.name for p in study.iterdir())
    r = hpctrain_here("study", "resume", str(study))
    assert r.returncode == 2, r.stdout + r.stderr
    assert "train.steps: must be >= 1 (got 0)" in r.stderr and "in: n1-r0" in r.stderr, r.stderr
    assert sorted(p.name for p in study.iterdir()) == before  # nothing renamed or started


def test_a_copied_study_resumes_where_it_now_is(tmp_path: Path) -> None:
    """`cp -a` of a study, then resume of the copy: before, refused as 'edited or moved'. The copy's
    own runs are found by name and run there; the original is left as it was."""
    import shutil

    r = hpctrain(*_study(tmp_path, "study.steps=4"), timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    [study] = list(tmp_path.glob("*/*-strong"))
    copy = tmp_path / "copy"
    shutil.copytree(study, copy, symlinks=True)
    (copy / "n1-r0" / "summary.json").unlink()  # pending in the copy only
    r = hpctrain("study", "resume", str(copy), "--no-progress", timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (copy / "n1-r0" / "summary.json").exists() and (study / "n1-r0" / "summary.json").exists()
    manifest = json.loads((copy / "study.json").read_text())
    assert [run["run_dir"] for run in manifest["runs"]] == [str(copy.resolve() / "n1-r0")]
    assert json.loads((copy / "n1-r0" / "plan.json").read_text())["run_dir"] == str(copy.resolve() / "n1-r0")


def test_a_killed_drivers_lock_is_free_while_the_step_it_started_still_runs(tmp_path: Path) -> None:
    """Issue 72 class 8: after a study's driver was SIGKILLed mid-step, `study resume` named the dead
    driver's pid as "another hpctrain". The lock's descriptor is not inherited by what the driver
    starts (a step's `bash -c … srun`, even by a library that keeps descriptors open: close_fds=False),
    so the kernel frees it with the driver; the step runs on."""
    import os
    import signal
    import subprocess
    import sys

    from hpctrain.orchestrate.lock import writer_lock

    driver = (
        "import os, signal, subprocess, sys\n"
        "from pathlib import Path\n"
        "from hpctrain.orchestrate.lock import writer_lock\n"
        "with writer_lock(Path(sys.argv[1]), 'study', 'resume'):\n"
        "    step = subprocess.Popen(['bash', '-c', 'sleep 60'], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, close_fds=False)\n"
        "    print(step.pid, flush=True)\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", driver, str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    step = int(proc.stdout.split()[0])
    try:
        os.kill(step, 0)  # the step still runs
        with writer_lock(tmp_path, "study", "resume"):
            pass
    finally:
        os.kill(step, signal.SIGKILL)
