"""A cluster behind SSH (cluster.remote), for real: an sshd on 127.0.0.1 (a free port, a host key
and a client key made for the test, public-key logins only), the install tests' user, whose
hpctrain was installed as the install page says and whose sessions see the local SLURM cluster
("the cluster"), and a laptop: a
project directory outside the checkout, with neither SLURM_CONF nor sbatch on its PATH, whose site
preset names the cluster. Everything the laptop does goes through the real ssh client."""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from hpctrain import __version__
from hpctrain.facts import free_tcp_port
from tests.conftest import ROOT, SlurmCluster, small_tmpfs
from tests.install.test_user_install import USER, VENV
from tests.install.test_user_install import user_home as user_home  # the fixture, used below

pytestmark = pytest.mark.slurm
SHORT = ["data=digits", "train.steps=8", "train.warmup_steps=2", "--no-progress"]


@dataclass(frozen=True)
class Laptop:
    project: Path
    env: dict[str, str]
    ssh_config: Path
    sshd_log: Path
    remote_home: Path

    def hpctrain(
        self, *args: str, timeout: float = 600, config: Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        env = dict(self.env)
        return subprocess.run(
            [sys.executable, "-m", "hpctrain.cli", *args],
            cwd=self.project,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def logins(self) -> int:
        return len(re.findall(r"Accepted publickey for " + USER, self.sshd_log.read_text()))


def _keygen(path: Path) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path.with_suffix(".pub").read_text().strip()


@pytest.fixture(scope="module")
def laptop(
    slurm_cluster: SlurmCluster, user_home: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Laptop]:
    keys = tmp_path_factory.mktemp("sshd")
    host_pub = _keygen(keys / "host_key")
    client_pub = _keygen(keys / "id_ed25519")
    home = user_home
    # no password at all ("*"), rather than useradd's locked one ("!"), which sshd refuses even
    # for a public key when it does not ask PAM
    subprocess.run(["usermod", "-p", "*", USER], check=True)
    for old in ("hpctrain", "MARK"):
        shutil.rmtree(home / old, ignore_errors=True)
    ssh_dir = home / ".ssh"
    ssh_dir.mkdir(mode=0o700, exist_ok=True)
    (ssh_dir / "authorized_keys").write_text(client_pub + "\n")
    for p in (ssh_dir, ssh_dir / "authorized_keys"):
        shutil.chown(p, USER, USER)
    (ssh_dir / "authorized_keys").chmod(0o600)
    admitted = subprocess.run(
        ["bash", str(ROOT / "slurm" / "add-user.sh"), USER], capture_output=True, text=True
    )
    assert admitted.returncode == 0, admitted.stderr
    port = free_tcp_port()
    venv_bin = home / VENV / "bin"  # the install page's environment of that user
    log = keys / "sshd.log"
    (keys / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {keys / 'host_key'}\nPidFile {keys / 'sshd.pid'}\n"
        f"AllowUsers {USER}\nPasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\n"
        "PubkeyAuthentication yes\nAuthorizedKeysFile .ssh/authorized_keys\nLogLevel VERBOSE\n"
        f"SetEnv PATH={venv_bin}:/usr/local/bin:/usr/bin:/bin SLURM_CONF={slurm_cluster.conf}\n"
    )
    Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege separation directory
    sshd = subprocess.Popen(["/usr/sbin/sshd", "-D", "-e", "-f", str(keys / "sshd_config"), "-E", str(log)])
    # the laptop: its own PATH (ssh and git, no SLURM client), no SLURM_CONF, its own cache
    bin_dir = tmp_path_factory.mktemp("laptop-bin")
    for tool in ("ssh", "git", "sh", "bash", "tar"):
        (bin_dir / tool).symlink_to(shutil.which(tool) or f"/usr/bin/{tool}")
    (keys / "known_hosts").write_text(f"[127.0.0.1]:{port} {host_pub}\n")
    ssh_config = keys / "ssh_config"
    ssh_config.write_text(
        f"Host cluster\n  HostName 127.0.0.1\n  Port {port}\n  User {USER}\n"
        f"  IdentityFile {keys / 'id_ed25519'}\n  IdentitiesOnly yes\n"
        f"  UserKnownHostsFile {keys / 'known_hosts'}\n  GlobalKnownHostsFile /dev/null\n"
    )
    project = tmp_path_factory.mktemp("laptop")
    (project / "notes.txt").write_text("the laptop's project\n")
    site = project / "conf" / "cluster"
    site.mkdir(parents=True)
    (site / "mysite.yaml").write_text(
        f"defaults: [slurm, _self_]\nremote: cluster\nremote_ssh_config: {ssh_config}\nranks_per_node: 1\n"
    )
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    subprocess.run(["git", "-C", str(project), "add", "-A"], check=True)
    env = {
        "PATH": f"{bin_dir}",
        "HOME": str(project),
        "HPCTRAIN_CACHE": str(tmp_path_factory.mktemp("c")),
        "HPCTRAIN_CONFIG_PATH": str(project / "conf"),
        "HPCTRAIN_SSH_BATCH": "1",
        "COLUMNS": "200",
        "LANG": "C.UTF-8",
    }
    deadline = time.monotonic() + 30
    while "Server listening" not in (log.read_text() if log.exists() else "") and time.monotonic() < deadline:
        time.sleep(0.1)
    try:
        yield Laptop(project, env, ssh_config, log, home)
    finally:
        subprocess.run(
            [
                "ssh",
                "-F",
                str(ssh_config),
                "-o",
                "ControlPath=" + env["HPCTRAIN_CACHE"] + "/ssh/%C",
                "-O",
                "exit",
                "cluster",
            ],
            capture_output=True,
        )
        sshd.terminate()
        sshd.wait(10)


def _ok(r: subprocess.CompletedProcess[str]) -> str:
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
    return r.stdout


def _local(laptop: Laptop, pattern: str) -> Path:
    (found,) = (laptop.project / "outputs").glob(pattern)
    return found


def test_a_run_planned_on_the_laptop_trains_on_the_cluster_and_its_records_come_back(laptop: Laptop) -> None:
    out = _ok(laptop.hpctrain("run", "cluster=mysite", "cluster.nodes=2", "run.name=two", *SHORT))
    assert "held-out accuracy" in out  # the cluster's summary, shown here
    local = _local(laptop, "*/*-two")
    ref = json.loads((local / "remote.json").read_text())
    assert ref["destination"] == "cluster" and ref["version"] == __version__
    summary = json.loads((local / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["nodes"] == 2 and summary["timed_steps"] == 6
    assert not (local / "code").exists() and not (local / "submitit").exists()  # left there
    there = laptop.remote_home / ref["remote_dir"]
    assert (there / "summary.json").exists() and there.stat().st_uid == pwd.getpwnam(USER).pw_uid
    assert "COMPLETED" in _ok(laptop.hpctrain("status", str(local)))
    assert "step 8/8" in _ok(laptop.hpctrain("logs", str(local)))
    # the code went once: a second command with the same code finds its bundle there
    assert len(list((laptop.remote_home / "hpctrain" / "bundles").iterdir())) == 1


def test_a_sweep_from_the_laptop_is_one_array_and_status_lists_every_point(laptop: Laptop) -> None:
    _ok(
        laptop.hpctrain(
            "run",
            "-m",
            "cluster=mysite",
            "train.steps=6,7,8",
            "run.name=sw",
            *SHORT[:1],
            "train.warmup_steps=2",
            "--no-progress",
        )
    )
    sweep = _local(laptop, "*/*-sw")
    manifest = json.loads((sweep / "sweep.json").read_text())
    assert len(manifest["runs"]) == 3 and [a["size"] for a in manifest["arrays"]] == [3]  # one job array
    status = _ok(laptop.hpctrain("status", str(sweep), "--all"))
    assert status.count("COMPLETED") >= 3, status


# Hydra parses it (a quoted string), so it reaches the cluster (Hydra's grammar refuses `$(` in any
# override before anything runs); newlines, quotes and `$(` inside words: tests/unit/test_remote.py
# runs the same script through a real sh
HOSTILE = "'a`touch MARK`b;touch MARK && touch MARK|tee MARK'"


def test_hostile_words_reach_the_cluster_as_data_and_a_refusal_creates_nothing(laptop: Laptop) -> None:
    before = (
        sorted((laptop.project / "outputs").rglob("remote.json"))
        if (laptop.project / "outputs").exists()
        else []
    )
    r = laptop.hpctrain("run", "cluster=mysite", f"run.name={HOSTILE}", *SHORT)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "run.name" in r.stderr  # the cluster's refusal, shown here
    assert not (laptop.remote_home / "MARK").exists() and not (laptop.project / "MARK").exists()
    after = (
        sorted((laptop.project / "outputs").rglob("remote.json"))
        if (laptop.project / "outputs").exists()
        else []
    )
    assert after == before  # nothing created here


def test_a_missing_key_or_an_unknown_host_key_is_named_at_once(laptop: Laptop, tmp_path: Path) -> None:
    text = laptop.ssh_config.read_text()
    no_key = tmp_path / "no_key"
    no_key.write_text(text.replace("id_ed25519", "missing_key"))
    unknown = tmp_path / "unknown_host"
    (tmp_path / "empty_known_hosts").write_text("")
    unknown.write_text(
        re.sub(r"UserKnownHostsFile \S+", f"UserKnownHostsFile {tmp_path / 'empty_known_hosts'}", text)
    )
    env_cache = laptop.env["HPCTRAIN_CACHE"]
    for config, said in ((no_key, "refused the login: add your key"), (unknown, "not in your known_hosts")):
        laptop.env["HPCTRAIN_CACHE"] = str(tmp_path / f"cache-{config.name}")  # no connection to ride on
        try:
            r = laptop.hpctrain(
                "run", "cluster=mysite", f"cluster.remote_ssh_config={config}", *SHORT, timeout=10
            )
        finally:
            laptop.env["HPCTRAIN_CACHE"] = env_cache
        assert r.returncode == 3 and said in r.stderr, r.stderr


def test_another_hpctrain_version_on_the_cluster_is_refused_naming_both(laptop: Laptop) -> None:
    other = laptop.remote_home / "old-hpctrain"
    other.write_text("#!/bin/sh\necho 'hpctrain 0.0.9'\n")
    other.chmod(0o755)
    r = laptop.hpctrain("run", "cluster=mysite", f"cluster.remote_hpctrain={other}", *SHORT)
    assert r.returncode == 3, r.stdout + r.stderr
    assert f"hpctrain here is {__version__}, on cluster it is 0.0.9" in r.stderr


def test_a_study_from_the_laptop_uses_one_connection_and_its_report_comes_back(laptop: Laptop) -> None:
    cache = laptop.env["HPCTRAIN_CACHE"]
    subprocess.run(
        ["ssh", "-F", str(laptop.ssh_config), "-o", f"ControlPath={cache}/ssh/%C", "-O", "exit", "cluster"],
        capture_output=True,
    )
    before = laptop.logins()
    _ok(
        laptop.hpctrain(
            "study",
            "strong",
            "cluster=mysite",
            "study.nodes=[1,2]",
            "study.repetitions=1",
            "study.steps=6",
            "study.warmup_steps=2",
            "study.allreduce_bench=false",
            "data=digits",
            "run.name=st",
            "--no-progress",
        )
    )
    assert laptop.logins() == before + 1  # version, code, dry run, study, report: one login
    study = _local(laptop, "*/*-st-strong")
    assert (study / "report" / "report.md").stat().st_size > 0 and (study / "report" / "points.csv").exists()
    # analyzed again from the laptop: there, and the report comes back (not to a path of this machine)
    shutil.rmtree(study / "report")
    assert "scaling" in _ok(laptop.hpctrain("analyze", str(study)))
    assert (study / "report" / "report.html").stat().st_size > 0
    refused = laptop.hpctrain("analyze", str(study), "--out", "here")
    assert refused.returncode == 2 and "--out" in refused.stderr, refused.stderr


def _close_connection(laptop: Laptop) -> None:
    cache = laptop.env["HPCTRAIN_CACHE"]
    subprocess.run(
        ["ssh", "-F", str(laptop.ssh_config), "-o", f"ControlPath={cache}/ssh/%C", "-O", "exit", "cluster"],
        capture_output=True,
    )


def test_logs_follow_and_cancel_work_on_a_running_job_from_the_laptop(laptop: Laptop) -> None:
    _ok(
        laptop.hpctrain(
            "run",
            "cluster=mysite",
            "--no-wait",
            "run.name=long",
            "data=digits",
            "train.steps=100000",
            "--no-progress",
        )
    )
    local = _local(laptop, "*/*-long")
    follow = subprocess.Popen(
        [sys.executable, "-m", "hpctrain.cli", "logs", str(local), "--follow"],
        cwd=laptop.project,
        env=laptop.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert follow.stdout is not None
    seen = ""
    deadline = time.monotonic() + 180
    while "step 10/100000" not in seen and time.monotonic() < deadline:
        seen += follow.stdout.readline()
    assert "step 10/100000" in seen, seen  # the running job's lines, as they come
    _ok(laptop.hpctrain("cancel", str(local)))
    follow.communicate(timeout=120)  # --follow ends with the run
    assert follow.returncode is not None
    status = _ok(laptop.hpctrain("status", str(local)))
    assert "CANCELLED" in status, status


def test_a_dropped_connection_leaves_the_study_running_and_resume_finishes_it_without_resubmitting(
    laptop: Laptop,
) -> None:
    study = subprocess.Popen(
        [sys.executable, "-m", "hpctrain.cli", "study", "strong", "cluster=mysite", "study.nodes=[1,2]",
         "study.repetitions=1", "study.steps=30", "study.warmup_steps=2", "study.allreduce_bench=false",
         "data=digits", "run.name=drop", "--no-progress"],
        cwd=laptop.project, env=laptop.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert study.stdout is not None
    seen = ""
    while "study strong:" not in seen:  # the cluster's study has planned its runs
        line = study.stdout.readline()
        assert line, study.communicate(timeout=60)
        seen += line
    _close_connection(laptop)
    out, err = study.communicate(timeout=120)
    local = _local(laptop, "*/*-drop-strong")
    follow_up = f"the command goes on there: hpctrain status {local.relative_to(laptop.project)}"
    assert study.returncode == 3 and follow_up in err, err
    sessions = laptop.remote_home / "hpctrain" / "sessions"
    deadline = time.monotonic() + 300
    while not any(
        (s / "rc").exists() and "drop" in (s / "driver.sh").read_text() for s in sessions.iterdir()
    ):
        assert time.monotonic() < deadline, "the study there never ended"
        time.sleep(1)
    r = _ok(laptop.hpctrain("study", "resume", str(local), "--no-progress"))
    assert "2 run(s) already finished; running the other 0" in r or "already finished" in r, r
    ids = [
        json.loads(p.read_text())["job_id"]
        for p in (laptop.remote_home / "hpctrain" / "runs").rglob("*-drop-strong/*/job.json")
    ]
    assert len(ids) == len(set(ids)) == 2  # nothing submitted twice
    assert (local / "report" / "report.md").stat().st_size > 0  # the report came back


def test_a_tune_from_the_laptop_runs_its_trials_there_and_its_choice_comes_back(laptop: Laptop) -> None:
    _ok(
        laptop.hpctrain(
            "tune", "cluster=mysite", "cluster.nodes=2", "data=digits", "train.steps=8", "train.warmup_steps=2",
            "parallelism.engine=ddp", "tune.keys=[parallelism.compression]", "run.name=tn",
        )
    )  # fmt: skip
    home = _local(laptop, "*/*-tn")
    trials = json.loads((home / "tune.json").read_text())["trials"]
    assert len(trials) >= 2 and (home / "best.yaml").exists()  # its records and choice, here
    assert all((home / t["name"] / "summary.json").exists() for t in trials if t.get("name"))


def test_a_full_disk_there_is_named_and_nothing_is_left_half_written(laptop: Laptop) -> None:
    """The cluster's remote_dir on a 64 KiB tmpfs (never the machine's disk) and 256 KiB of code to
    send: the command fails naming the disk, no half-written bundle stays there, and nothing was
    created here."""
    tiny = laptop.remote_home / "tinydisk"
    shutil.rmtree(tiny, ignore_errors=True)  # an earlier session's mount point (unmounted)
    (laptop.project / "big.bin").write_bytes(os.urandom(256 * 1024))  # untracked: only this test sends it
    try:
        with small_tmpfs(tiny, "64k"):
            shutil.chown(tiny, USER, USER)
            r = laptop.hpctrain(
                "run", "cluster=mysite", f"cluster.remote_dir={tiny}", "code.include=[big.bin]",
                "run.name=full", *SHORT,
            )  # fmt: skip
            assert r.returncode == 3, r.stdout + r.stderr
            assert "could not be written on cluster" in r.stderr and "No space left on device" in r.stderr, (
                r.stderr
            )
            bundles = tiny / "bundles"
            assert not bundles.exists() or list(bundles.iterdir()) == []  # the half-sent one removed
    finally:
        (laptop.project / "big.bin").unlink()
        shutil.rmtree(tiny, ignore_errors=True)
    assert not list((laptop.project / "outputs").glob("*/*-full"))
