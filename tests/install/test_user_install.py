"""hpctrain installed the way a cluster user installs it: the wheel built from this checkout, put
into a fresh environment outside the checkout by a non-root user, with apt, dpkg and sudo
unavailable (each masked in a private mount namespace), and run from there: a 2-rank local run
that learns, doctor, a SLURM dry run, a site preset from the user's config directory, a Hydra app
swept with hydra/launcher=hpctrain_local, and a 2-node SLURM job whose records the user owns.

The environment is built once per test session (`uv pip install`, as fast as a cached install:
seconds) and shared by the two streams through a lock; torch is pinned to this suite's own build
(the CPU build here), everything else resolves from the index as for any user."""

from __future__ import annotations

import fcntl
import json
import os
import pwd
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from hpctrain import __version__
from tests.conftest import ROOT, SlurmCluster

USER = "hpctrain-user"
MASKED = ("apt", "apt-get", "dpkg", "sudo")
# mask each tool the machine has with /dev/null (running it says "Permission denied"), then become
# the user with a clean environment: what a login shell of theirs would have
AS_USER = (
    "for t in " + " ".join(MASKED) + "; do "
    'p=$(command -v "$t") && mount --bind /dev/null "$p"; done; '
    'exec runuser -u "$WHO" -- env -i HOME="$HOMEDIR" USER="$WHO" PATH="$UPATH" LANG=C.UTF-8 "$@"'
)


def as_user(
    home: Path,
    *argv: str,
    cwd: Path | None = None,
    extra: dict[str, str] | None = None,
    timeout: float = 600,
) -> subprocess.CompletedProcess[str]:
    """argv as the user, in a private mount namespace; `extra`: NAME=VALUE words env(1) sets too."""
    shell = {
        "WHO": USER,
        "HOMEDIR": str(home),
        "UPATH": f"{home / 'env' / 'bin'}:/usr/local/bin:/usr/bin:/bin",
        "PATH": os.environ["PATH"],
    }
    assigned = [f"{k}={v}" for k, v in (extra or {}).items()]
    return subprocess.run(
        [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "bash",
            "-c",
            AS_USER,
            "as-user",
            *assigned,
            *argv,
        ],
        capture_output=True,
        text=True,
        env=shell,
        cwd=cwd or home,
        timeout=timeout,
    )


@pytest.fixture(scope="session")
def user_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The user (created once per machine), and this session's fresh environment in their home."""
    if subprocess.run(["id", "-u", USER], capture_output=True).returncode != 0:
        subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", USER], check=True)
    home = Path(pwd.getpwnam(USER).pw_dir)
    session = os.environ.get("PYTEST_XDIST_TESTRUNUID", str(os.getppid()))
    with open(home.parent / f".{USER}.lock", "a") as lock:  # noqa: PTH123
        fcntl.flock(lock, fcntl.LOCK_EX)  # the other stream waits, then reuses this session's
        stamp = home / ".hpctrain-test-session"
        if not stamp.exists() or stamp.read_text() != session:
            _fresh_environment(home, tmp_path_factory.mktemp("wheel"))
            stamp.write_text(session)
    yield home


def _fresh_environment(home: Path, out: Path) -> None:
    for old in ("env", "outputs", "multirun", ".config", "app", "wheel"):
        shutil.rmtree(home / old, ignore_errors=True)
    # the sdist, then the wheel from the sdist (so the sdist is complete): what a release uploads;
    # uv's build front end, as `python -m build` builds them (the same files; 4.7 CPU-s to 9.7)
    uv = str(Path(sys.executable).with_name("uv"))
    built = subprocess.run([uv, "build", "--out-dir", str(out), str(ROOT)], capture_output=True, text=True)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    (wheel,), (sdist,) = out.glob("hpctrain-*.whl"), out.glob("hpctrain-*.tar.gz")
    checked = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", str(wheel), str(sdist)],
        capture_output=True,
        text=True,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    with zipfile.ZipFile(wheel) as z:  # what a command reads at run time ships inside the package
        names = set(z.namelist())
    shipped = {
        "hpctrain/conf/config.yaml",
        "hpctrain/conf/cluster/slurm.yaml",
        "hpctrain/containers/hpctrain.def",
    }
    assert shipped | {"hydra_plugins/hpctrain_launcher/launcher.py"} <= names
    (home / "wheel").mkdir()
    shutil.copy(wheel, home / "wheel")
    shutil.chown(home / "wheel", USER)
    links = [f"--find-links={d}" for d in os.environ.get("PIP_FIND_LINKS", "").split() if d]
    made = as_user(home, uv, "venv", "-q", "--python", "/usr/bin/python3", str(home / "env"))
    assert made.returncode == 0, made.stderr
    # the site's network settings (its CA bundle, proxies), as a user's login environment has them
    net = {
        k: v
        for k, v in os.environ.items()
        if k.startswith(("SSL_CERT_", "PIP_")) or k.lower().endswith("_proxy")
    }
    torch_pin = f"torch=={torch.__version__}"  # this suite's build (CPU here): no CUDA download
    got = as_user(
        home, uv, "pip", "install", "-q", "--python", str(home / "env" / "bin" / "python"), *links,
        str(home / "wheel" / wheel.name), torch_pin, extra=net,
    )  # fmt: skip
    assert got.returncode == 0, got.stdout[-3000:] + got.stderr[-3000:]


def _ok(r: subprocess.CompletedProcess[str]) -> str:
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
    assert "Traceback" not in r.stderr, r.stderr
    return r.stdout


@pytest.mark.mpi
def test_a_pip_installed_hpctrain_trains_as_a_user_without_root_and_learns(user_home: Path) -> None:
    assert as_user(user_home, "sudo", "true").returncode != 0  # masked: no root to be had
    assert as_user(user_home, "apt-get", "--version").returncode != 0
    assert _ok(as_user(user_home, "hpctrain", "--version")).strip() == f"hpctrain {__version__}"
    doctor = _ok(as_user(user_home, "hpctrain", "doctor", extra={"COLUMNS": "250"}))
    shipped = user_home / "env" / "lib"
    assert "configs (hpctrain)" in doctor and str(shipped) in doctor and "hpctrain install horovod" in doctor
    run = as_user(
        user_home, "hpctrain", "run", "cluster.ranks=2", "data=digits", "train.steps=60", "--no-progress",
        extra={"COLUMNS": "200"},
    )  # fmt: skip
    _ok(run)
    (summary_file,) = (user_home / "outputs").glob("*/*-train/summary.json")
    summary = json.loads(summary_file.read_text())
    assert summary["engine"] == "ddp" and summary["world_size"] == 2  # no Horovod: DDP, not a refusal
    assert summary["last_loss"] < summary["first_loss"] / 2 and summary["heldout_accuracy"] > 0.8, summary
    assert "held-out accuracy" in run.stdout
    owner = pwd.getpwnam(USER).pw_uid
    assert {p.stat().st_uid for p in summary_file.parent.rglob("*")} == {owner}


@pytest.mark.mpi
def test_a_site_preset_and_a_slurm_dry_run_from_the_users_config_directory(user_home: Path) -> None:
    site = user_home / ".config" / "hpctrain" / "cluster"
    _ok(as_user(user_home, "mkdir", "-p", str(site)))
    preset = (
        "defaults:\n  - slurm\n  - _self_\npartition: gpu\naccount: proj1\nsetup: ['module load openmpi']\n"
    )
    _ok(as_user(user_home, "python", "-c", f"open({str(site / 'mysite.yaml')!r}, 'w').write({preset!r})"))
    dry = _ok(as_user(user_home, "hpctrain", "run", "cluster=mysite", "cluster.nodes=2", "--dry-run"))
    assert (
        "#SBATCH --partition=gpu" in dry and "#SBATCH --account=proj1" in dry and "module load openmpi" in dry
    )
    assert "#SBATCH --nodes=2" in dry
    _ok(as_user(user_home, "hpctrain", "run", "cluster=slurm", "--dry-run"))
    assert "configs (user)" in _ok(as_user(user_home, "hpctrain", "doctor", extra={"COLUMNS": "250"}))


APP = """
import os
import hydra
from omegaconf import DictConfig


@hydra.main(version_base=None, config_path=None)
def main(cfg: DictConfig) -> int:
    print(f"rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']}: x={cfg.x}", flush=True)
    return int(cfg.x) * 10


if __name__ == "__main__":
    main()
"""


@pytest.mark.mpi
def test_a_users_hydra_app_sweeps_with_the_local_launcher(user_home: Path) -> None:
    app = user_home / "app"
    _ok(as_user(user_home, "mkdir", "-p", str(app)))
    _ok(as_user(user_home, "python", "-c", f"open({str(app / 'app.py')!r}, 'w').write({APP!r})"))
    out = as_user(
        user_home, "python", "app.py", "-m", "hydra/launcher=hpctrain_local", "hydra.launcher.ranks=2", "+x=1,2",
        cwd=app,
    )  # fmt: skip
    _ok(out)
    logs = "".join(p.read_text() for p in (app / "multirun").rglob("*.out"))
    logs += out.stdout
    for x in (1, 2):
        assert any(f"rank {r} of 2: x={x}" in logs for r in (0, 1)), logs[-3000:]


@pytest.mark.slurm
def test_a_user_submits_a_two_node_run_to_slurm_and_owns_its_records(
    user_home: Path, slurm_cluster: SlurmCluster
) -> None:
    admitted = subprocess.run(
        ["bash", str(ROOT / "slurm" / "add-user.sh"), USER], capture_output=True, text=True
    )
    assert admitted.returncode == 0, admitted.stderr
    run_dir = user_home / "outputs" / "slurm-2node"
    r = as_user(
        user_home, "hpctrain", "run", "cluster=slurm", "cluster.nodes=2", "cluster.ranks_per_node=1",
        "data=digits", "train.steps=8", "train.warmup_steps=2", f"run.dir={run_dir}", "--no-progress",
        extra={"SLURM_CONF": slurm_cluster.conf},
    )  # fmt: skip
    _ok(r)
    summary = json.loads((run_dir / "summary.json").read_text())
    hosts = json.loads((run_dir / "env.json").read_text())["hosts"]
    assert summary["world_size"] == 2 and len(set(hosts)) == 2, hosts
    owner = pwd.getpwnam(USER).pw_uid
    assert {p.stat().st_uid for p in run_dir.rglob("*")} == {owner}
    job = json.loads((run_dir / "job.json").read_text())
    acct = subprocess.run(
        ["sacct", "-n", "-X", "-P", "-j", str(job["job_id"]), "-o", "User,Account,State"],
        capture_output=True,
        text=True,
        env=dict(os.environ, SLURM_CONF=slurm_cluster.conf),
    )
    assert acct.stdout.strip().splitlines()[0] == f"{USER}|users|COMPLETED", acct.stdout + acct.stderr
