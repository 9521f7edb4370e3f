"""slurm/install.sh, run twice at once on a machine that lacks the packages (the test command
starts the 22.05 and the 24.11 clusters side by side, and both install on a bare machine): one
installs, the other waits and finds nothing left to do. dpkg and apt-get are stand-ins on PATH;
the stand-in apt-get fails as the real one does when another holds dpkg's lock."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

DPKG = """#!/bin/sh
[ -e "$FAKE/installed" ]
"""
APT_GET = """#!/bin/sh
echo "$*" >> "$FAKE/calls"
case " $* " in *" install "*)
  exec 8>"$FAKE/dpkg-lock"
  flock -n 8 || { echo "E: Unable to acquire the dpkg frontend lock" >&2; exit 100; }
  sleep 1; touch "$FAKE/installed" ;;
esac
"""


def test_two_installs_at_once_install_once_and_both_succeed(tmp_path: Path) -> None:
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    for name, text in (("dpkg", DPKG), ("apt-get", APT_GET)):
        (bin_ / name).write_text(text)
        (bin_ / name).chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bin_}:{os.environ['PATH']}",
        "FAKE": str(tmp_path),
        "HPCTRAIN_CACHE": str(tmp_path / "cache"),
        "HPCTRAIN_POLICY_RC": str(tmp_path / "policy-rc.d"),
    }
    script = ["bash", str(ROOT / "slurm" / "install.sh")]
    both = [subprocess.Popen(script, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for _ in range(2)]  # fmt: skip
    outs = [p.communicate(timeout=60)[0] for p in both]
    assert [p.returncode for p in both] == [0, 0], outs
    calls = (tmp_path / "calls").read_text().splitlines()
    assert sum(" install " in f" {c} " for c in calls) == 1, calls
    assert all(c.startswith("-o DPkg::Lock::Timeout=600 ") for c in calls), calls  # waits for other apts
    assert sum("[slurm] installing: slurmctld" in out for out in outs) == 1, outs
    assert not (tmp_path / "policy-rc.d").exists()  # removed again by the one that wrote it
