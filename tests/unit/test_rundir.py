"""launch/rundir.py: a refused command leaves no directory it created (issue 72, class 8: study and
run directories were left behind when sbatch refused the job)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpctrain import records
from hpctrain.errors import LaunchError
from hpctrain.launch.rundir import claim_fresh, prepare_run_dir, undone_if_refused


def test_a_refused_start_removes_the_directories_it_made_and_keeps_the_rest(tmp_path: Path) -> None:
    kept = tmp_path / "kept"
    kept.mkdir()
    sweep, run = tmp_path / "sweep", tmp_path / "sweep" / "run-0"
    with pytest.raises(LaunchError), undone_if_refused([sweep, run, kept]) as made:
        prepare_run_dir(run)
        made.append(claim_fresh(tmp_path / "claimed"))
        raise LaunchError("sbatch refused the job")
    assert not sweep.exists() and not (tmp_path / "claimed").exists() and kept.is_dir()


def test_a_started_run_and_another_failure_keep_everything(tmp_path: Path) -> None:
    run = tmp_path / "run"
    with pytest.raises(LaunchError), undone_if_refused([run]):
        prepare_run_dir(run)
        (run / records.JOB).write_text("{}")  # a job was started: its records stay
        raise LaunchError("the second array was refused")
    assert (run / records.JOB).exists()
    other = tmp_path / "other"
    with pytest.raises(KeyboardInterrupt), undone_if_refused([other]):
        prepare_run_dir(other)
        raise KeyboardInterrupt  # not a refusal: a run may be under way
    assert other.is_dir()
