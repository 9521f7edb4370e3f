"""Round 5, class 3: the Hydra launchers' settings get `hpctrain run`'s rules and messages, and
nothing is created or started when one is broken: Hydra prints hpctrain's message alone (no
traceback), naming the setting as the user wrote it. Before, `timeout_min=-1` started the job and
gave up on it at once with a traceback, and `ranks=0` or `stall_timeout_s=nan` ended in one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

APP = """\
import hydra


@hydra.main(version_base=None, config_path=None)
def main(cfg):
    return 1


if __name__ == "__main__":
    main()
"""


@pytest.mark.parametrize(
    "setting, said",
    [
        ("timeout_min=-1", "hydra.launcher.timeout_min: must be a positive number of minutes (got -1.0)"),
        ("ranks=0", "hydra.launcher.ranks: must be >= 1 (got 0)"),
        ("ranks=-2", "hydra.launcher.ranks: must be >= 1 (got -2)"),
        ("stall_timeout_s=nan", "hydra.launcher.stall_timeout_s:"),
        ("threads_per_rank=100000", "hydra.launcher.threads_per_rank: 100000 threads x 2 ranks"),
        # class 9: a spawn start would ignore the default backend=mpi a Horovod task meets through
        (
            "starter=spawn",
            "hydra.launcher.starter: spawn starts the ranks without MPI, and hydra.launcher.backend=mpi",
        ),
    ],
)
def test_a_broken_launcher_setting_is_refused_before_anything_starts(
    tmp_path: Path, setting: str, said: str
) -> None:
    (tmp_path / "app.py").write_text(APP)
    sweep = tmp_path / "sweep"
    r = subprocess.run(
        [
            sys.executable,
            "app.py",
            "-m",
            "hydra/launcher=hpctrain_local",
            f"hydra.launcher.{setting}",
            f"hydra.sweep.dir={sweep}",
            "+x=1,2",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 1, r.stdout + r.stderr
    assert said in r.stderr and "hpctrain's launcher: invalid configuration" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    assert not (sweep / ".hpctrain").exists()  # nothing created, nothing started
