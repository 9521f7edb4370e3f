"""Runs that start after others (run.after, hpctrain run --after): the entries parsed, the jobs
read from run and sweep directories, SLURM's dependency in the sbatch script, and refusals that
name the key and the fix before anything is submitted."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpctrain import records
from hpctrain.errors import ConfigError
from hpctrain.orchestrate.after import parse_after
from tests.conftest import hpctrain_here


def _job(run_dir: Path, launcher: str, job_id: str) -> Path:
    run_dir.mkdir(parents=True)
    records.write(run_dir / records.JOB, records.JobRef(records.FORMAT_VERSION, launcher, job_id, 2))
    return run_dir


@pytest.mark.parametrize(
    "entry, path, ok",
    [
        ("runs/a", "runs/a", True),
        ("runs/a:ok", "runs/a", True),
        ("runs/a:any", "runs/a", False),
        ("/x/y:z/w", "/x/y:z/w", True),
    ],
)
def test_an_entry_names_a_directory_and_whether_its_jobs_must_complete(
    entry: str, path: str, ok: bool
) -> None:
    assert parse_after(entry) == (Path(path), ok)


def test_an_unknown_mode_is_refused_naming_the_fix() -> None:
    with pytest.raises(ConfigError, match=r"(?s)run\.after.*ends in :done.*:ok .*:any"):
        parse_after("runs/a:done")


def test_slurm_holds_the_job_until_each_earlier_job_with_its_mode(tmp_path: Path) -> None:
    a, b = _job(tmp_path / "a", "slurm", "41"), _job(tmp_path / "b", "slurm", "42_3")
    r = hpctrain_here("run", "--dry-run", "cluster=slurm", "--after", str(a), "--after", f"{b}:any")
    assert r.returncode == 0, r.stderr
    assert "#SBATCH --dependency=afterok:41,afterany:42_3" in r.stdout, r.stdout


@pytest.mark.parametrize(
    "make, rule",
    [
        (lambda d: d, "is not a run, sweep, study or tune directory"),
        (lambda d: _job(d / "loc", "local", "123"), "a SLURM job can only wait for SLURM jobs"),
    ],
)
def test_what_cannot_be_waited_for_is_refused_before_anything_is_submitted(
    tmp_path: Path, make, rule: str
) -> None:
    r = hpctrain_here(
        "run", "cluster=slurm", "run.dir=" + str(tmp_path / "new"), "--after", str(make(tmp_path))
    )
    assert r.returncode == 2 and "run.after" in r.stderr and rule in r.stderr, r.stderr
    assert not (tmp_path / "new").exists()


def test_the_jobs_waiting_on_a_run_are_read_from_squeues_dependency_column() -> None:
    from hpctrain.launch.slurm.launcher import waiting_on

    squeue = "\n".join(
        [
            "50|afterok:41(unfulfilled)",
            "51|afterany:42_3(unfulfilled),afterok:7(unfulfilled)",
            "52|afterok:42(unfulfilled)",  # the whole array 42
            "53|afterok:43_1(unfulfilled)",
            "54|(null)",
            "55|afterok:9:41(unfulfilled)",
        ]
    )
    assert waiting_on(squeue, {"41", "42_3"}) == [
        ("50", "afterok"),
        ("51", "afterany"),  # issue 72 class 8: was told it "can never start" after a cancel
        ("52", "afterok"),
        ("55", "afterok"),
    ]


def test_a_job_that_ended_between_status_and_scancel_is_not_a_failed_cancel() -> None:
    """A fresh-clone run: `hpctrain cancel` of a study in one allocation failed (exit 3) because a
    step had finished a moment before scancel named it; scancel still cancelled the rest."""
    from hpctrain.launch.slurm.launcher import ended_meanwhile

    assert ended_meanwhile("scancel: error: Kill job error on job step id 1578: Invalid job id specified\n")
    assert ended_meanwhile(
        "scancel: error: Kill job error on job id 12: Job/step already completing or completed"
    )
    assert not ended_meanwhile("scancel: error: Kill job error on job id 12: Access/permission denied")
    assert not ended_meanwhile("Invalid job id specified\nscancel: error: Unable to contact slurm controller")
    assert not ended_meanwhile("")
