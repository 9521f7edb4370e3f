"""Runs that start after others on the local SLURM cluster (hpctrain run --after): SLURM holds the
job until the earlier one completes; one that was to start after a failed run is cancelled with
the reason, naming it. And locally: the command waits, and refuses to start after a failure."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.conftest import hpctrain, start_run, wait_done, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_cluster")]


def _script(tmp_path: Path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text(body)
    return f"script.path={path}"


def _times(job: str) -> tuple[str, str]:
    out = subprocess.run(
        ["sacct", "-j", job, "-X", "-n", "-P", "-o", "Start,End"], capture_output=True, text=True
    )
    start, end = out.stdout.split()[0].split("|")
    return start, end


@pytest.mark.slurm_versions
def test_a_slurm_run_starts_after_the_one_it_names_and_never_after_a_failed_one(tmp_path: Path) -> None:
    slow = _script(tmp_path, "slow.py", "import time\ntime.sleep(8)\n")
    fails = _script(tmp_path, "fails.py", "raise SystemExit(3)\n")
    quick = _script(tmp_path, "quick.py", "print('after')\n")
    common = ["cluster=slurm", "cluster.nodes=1", "code.snapshot=false"]
    first = start_run(tmp_path / "first", *common, slow)
    bad = start_run(tmp_path / "bad", *common, fails)
    later = start_run(tmp_path / "second", *common, quick, "--after", str(tmp_path / "first"))
    assert (
        json.loads((tmp_path / "second" / "plan.json").read_text())["executor"]["dependency"]
        == f"afterok:{first}"
    )
    waiting = "Dependency: waiting for the jobs it starts after"
    second_status = lambda: hpctrain("status", str(tmp_path / "second")).stdout  # noqa: E731
    wait_for("status to say the second run waits for the first", lambda: waiting in second_status(), 30)
    never = hpctrain(
        "run", f"run.dir={tmp_path / 'never'}", *common, quick, "--after", f"{tmp_path / 'bad'}:ok"
    )
    assert never.returncode == 3, never.stdout + never.stderr
    assert "DependencyNeverSatisfied" in never.stderr and "were cancelled" in never.stderr, never.stderr
    assert wait_done(first) == "COMPLETED" and wait_done(later) == "COMPLETED" and wait_done(bad) == "FAILED"
    assert _times(later)[0] >= _times(first)[1]  # it started once the first had ended


def test_a_local_run_after_a_failed_one_starts_nothing_and_after_a_finished_one_starts(
    tmp_path: Path,
) -> None:
    fails = _script(tmp_path, "fails.py", "raise SystemExit(3)\n")
    quick = _script(tmp_path, "quick.py", "print('after')\n")
    one = ["cluster.ranks=1"]
    assert hpctrain("run", f"run.dir={tmp_path / 'bad'}", *one, fails).returncode == 4
    r = hpctrain("run", f"run.dir={tmp_path / 'never'}", *one, quick, "--after", str(tmp_path / "bad"))
    assert r.returncode == 3 and "ended FAILED" in r.stderr and "nothing was started" in r.stderr, r.stderr
    assert not (tmp_path / "never").exists()
    r = hpctrain("run", f"run.dir={tmp_path / 'any'}", *one, quick, "--after", f"{tmp_path / 'bad'}:any")
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"{tmp_path / 'bad'}:any" in (tmp_path / "any" / "config.yaml").read_text()  # run.after, recorded


def test_cancel_names_the_jobs_that_wait_on_a_run_and_cancels_them_when_asked(tmp_path: Path) -> None:
    common = ["cluster=slurm", "cluster.nodes=1", "code.snapshot=false"]
    lead = start_run(
        tmp_path / "lead", *common, _script(tmp_path, "lead.py", "import time\ntime.sleep(60)\n")
    )
    quick = _script(tmp_path, "quick.py", "print('after')\n")
    follower = start_run(tmp_path / "follower", *common, quick, "--after", str(tmp_path / "lead"))
    anyway = start_run(tmp_path / "anyway", *common, quick, "--after", f"{tmp_path / 'lead'}:any")
    said = hpctrain("cancel", str(tmp_path / "lead")).stdout  # not interactive: named, not cancelled
    assert (
        f"cancelled 1 job(s): {lead}" in said
        and f"1 job(s) wait on these: {follower}; they can never" in said
    )
    assert "--with-dependents" in said
    # issue 72 class 8: the :any one was told it could never start; it starts, as SLURM says
    assert f"1 job(s) wait on these to end: {anyway}; they start now" in said, said
    assert wait_done(anyway) == "COMPLETED"  # as it was told
    said = hpctrain("cancel", str(tmp_path / "lead"), "--with-dependents").stdout
    assert f"cancelled 1 job(s) that waited on them: {follower}" in said, said
    assert wait_done(lead) == "CANCELLED" and wait_done(follower) == "CANCELLED"
