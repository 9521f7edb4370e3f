"""hpctrain installed the way a cluster user installs it, by docs/install.md's commands run
literally: the release's wheel and sdist built from this checkout, then, as a non-root user with
apt, dpkg and sudo unavailable (each masked in a private mount namespace), the page's block: a
virtual environment, uv, torch, the wheel, `hpctrain doctor` (exit 0, and every fix it prints is
a command that user can run or says what it needs), and the page's first run, which learns. Then
from that environment: a SLURM dry run, a site preset from the user's config directory, a Hydra
app swept with hydra/launcher=hpctrain_local, and a 2-node SLURM job whose records the user
owns; and the page's other ways in (the sdist, a clone, a git URL), each into a fresh environment.

One line of the page is not run as written: torch's, whose `--torch-backend=cpu` reaches
PyTorch's own index, which this machine cannot; it installs this suite's torch build (the CPU
build here) from the local wheels instead. Everything else resolves from the index as for any
user. The environment is built once per test session and shared by the two streams (a lock)."""

from __future__ import annotations

import fcntl
import json
import os
import pwd
import re
import shlex
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


PAGE = ROOT / "docs" / "install.md"
VENV = "venvs/hpctrain"  # the page's environment, in the user's home
TORCH_LINE = "uv pip install torch --torch-backend=cpu"


def page_block(first: str) -> list[str]:
    """The lines of the install page's bash block whose first line starts with `first`."""
    blocks = re.findall(r"^```bash\n(.*?)^```", PAGE.read_text(), flags=re.M | re.S)
    found = [b.splitlines() for b in blocks if b.startswith(first)]
    assert found, f"docs/install.md has no bash block starting with {first!r}"
    return found[0]


def _command(line: str) -> str:
    return line.split("  #")[0].strip()


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
        "UPATH": f"{home / VENV / 'bin'}:/usr/local/bin:/usr/bin:/bin",
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
    for old in ("env", "venvs", "variants", "outputs", "multirun", ".config", "app", "wheel", "hpctrain"):
        shutil.rmtree(home / old, ignore_errors=True)
    for old in home.glob("hpctrain-*"):
        old.unlink()
    wheel, sdist = _release(out)
    for f in (wheel, sdist):  # the release's files, where the user downloaded them
        shutil.copy(f, home)
        shutil.chown(home / f.name, USER)
    block = page_block("python3 -m venv")
    assert TORCH_LINE in map(_command, block) and f"uv pip install {wheel.name}" in map(_command, block)
    script = "\n".join(_torch_here() if _command(x) == TORCH_LINE else x for x in block)
    done = as_user(home, "bash", "-c", f"set -euxo pipefail\n{script}", extra=_network())
    assert done.returncode == 0, (
        f"docs/install.md's block failed:\n{done.stdout[-4000:]}\n{done.stderr[-6000:]}"
    )
    (home / "install.out").write_text(done.stdout)


def _release(out: Path) -> tuple[Path, Path]:
    """The sdist, then the wheel from the sdist (so the sdist is complete): what a release uploads;
    uv's build front end, as `python -m build` builds them (the same files; 4.7 CPU-s to 9.7)."""
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
    return wheel, sdist


def _torch_here() -> str:
    """The torch line as this machine can run it: this suite's build (CPU here), no CUDA download."""
    links = [f"--find-links={d}" for d in os.environ.get("PIP_FIND_LINKS", "").split() if d]
    return " ".join(["uv", "pip", "install", "-q", *links, f"torch=={torch.__version__}"])


def _network() -> dict[str, str]:
    """The site's network settings (its CA bundle, proxies), as a user's login environment has them."""
    return {
        k: v
        for k, v in os.environ.items()
        if k.startswith(("SSL_CERT_", "PIP_")) or k.lower().endswith("_proxy")
    }


def _ok(r: subprocess.CompletedProcess[str]) -> str:
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
    assert "Traceback" not in r.stderr, r.stderr
    return r.stdout


@pytest.mark.mpi
def test_the_install_pages_commands_install_and_train_as_a_user_without_root(user_home: Path) -> None:
    assert as_user(user_home, "sudo", "true").returncode != 0  # masked: no root to be had
    assert as_user(user_home, "apt-get", "--version").returncode != 0
    assert _ok(as_user(user_home, "hpctrain", "--version")).strip() == f"hpctrain {__version__}"
    # the page's first run: DDP without Horovod (not a refusal), 2 ranks, and the loss falls
    (summary_file,) = (user_home / "outputs").glob("*/*-train/summary.json")
    summary = json.loads(summary_file.read_text())
    assert summary["engine"] == "ddp" and summary["world_size"] == 2 and summary["timed_steps"] > 0
    assert summary["last_loss"] < summary["first_loss"] / 2 and summary["heldout_accuracy"] > 0.8, summary
    said = (user_home / "install.out").read_text()
    assert "held-out accuracy" in said and "ready for local runs" in said
    owner = pwd.getpwnam(USER).pw_uid
    assert {p.stat().st_uid for p in summary_file.parent.rglob("*")} == {owner}
    # doctor's configs come from the installed package, and every fix it prints is the user's to
    # run here (its command is on their PATH) or says plainly what it needs
    doctor = json.loads(_ok(as_user(user_home, "hpctrain", "doctor", "--json")))
    shipped = str(user_home / VENV / "lib")
    assert any(c["name"] == "configs (hpctrain)" and c["detail"].startswith(shipped) for c in doctor)
    for check in (c for c in doctor if not c["ok"]):
        fix = check["fix"]
        if fix.startswith(("needs root:", "needs a clone of", "ask your site", "submit from your cluster")):
            continue
        word = fix.split()[0]
        found = as_user(user_home, "bash", "-c", f"command -v {shlex.quote(word)}")
        assert found.returncode == 0, f"{check['name']}: {fix!r}: {word} is not the user's to run"
    assert any(c["name"] == "horovod" and c["fix"] == "hpctrain install horovod" for c in doctor)


@pytest.mark.mpi
@pytest.mark.parametrize("way", ["tar.gz", "clone", "git"])
def test_the_install_pages_other_ways_in_install_hpctrain(user_home: Path, way: str) -> None:
    """The page's other lines for hpctrain itself, each into a fresh environment (torch first, as
    the page says): the release's source archive, a clone (the archive unpacked stands in for
    it) and a git URL of it (that clone made a repository, as the user's own clone would be)."""
    (line,) = [
        _command(x)
        for x in page_block("uv pip install hpctrain-")
        if {"tar.gz": ".tar.gz", "clone": "./hpctrain", "git": "git+"}[way] in x
    ]
    src = user_home / "variants" / way
    sdist = next(user_home.glob("hpctrain-*.tar.gz")).name
    setup = [
        f"mkdir -p {src} && cd {src} && cp ~/{sdist} .",
        f"tar xzf {sdist} && mv {sdist.removesuffix('.tar.gz')} hpctrain",
        "git -C hpctrain init -q && git -C hpctrain add -A && git -C hpctrain -c user.name=u -c user.email=u@h commit -qm r",
        f"uv venv -q env && source env/bin/activate && {_torch_here()}",
        line.replace("<url of your clone>", f"file://{src}/hpctrain"),
        "hpctrain --version && hpctrain run --dry-run cluster=slurm | grep -q '#SBATCH'",
        "python -c 'import hpctrain, sys; sys.exit(\"site-packages\" not in hpctrain.__file__)'",
    ]
    r = as_user(user_home, "bash", "-c", "set -euxo pipefail\n" + "\n".join(setup), extra=_network())
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    assert f"hpctrain {__version__}" in r.stdout


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
