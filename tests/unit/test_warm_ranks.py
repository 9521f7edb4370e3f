"""The tests' warm zygote (tests/warm) stands in for a process start faithfully: what the rank
prints, its exit status or signal, signals sent to its client, and its end with its client."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT, WARM, wait_for


@pytest.fixture
def zygote(tmp_path: Path) -> Iterator[Path]:
    sock = tmp_path / "z.sock"
    z = subprocess.Popen([sys.executable, "-m", "tests.warm.zygote", str(sock), "--bare"], cwd=ROOT)
    try:
        wait_for("the zygote's socket", sock.exists, 30)
        yield sock
    finally:
        z.kill()
        z.wait()


def rank(sock: Path, cwd: Path, *args: str, umask: int = -1, **env_: str) -> subprocess.Popen[str]:
    # PYTHONPATH: `-m tests.warm.sample` from another directory, as a cold start would find it
    env = dict(os.environ, HPCTRAIN_TEST_ZYGOTE=str(sock), WARM_X="42", PYTHONPATH=str(ROOT), **env_)
    cmd = [sys.executable, "-I", "-S", str(WARM / "client.py"), "-m", "tests.warm.sample", *args]
    return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, text=True, umask=umask)


def test_a_warm_rank_has_its_clients_streams_environment_and_exit_status(
    zygote: Path, tmp_path: Path
) -> None:
    p = rank(zygote, tmp_path, "exit", "3", umask=0o027)  # the zygote's is 022
    out, _ = p.communicate(timeout=30)
    assert p.returncode == 3
    said, pid = out.split(" pid=")
    assert said == f"cwd={tmp_path} path={[str(tmp_path), str(ROOT)]} x=42 argv=['exit', '3'] mask=27"
    assert int(pid) != p.pid  # forked


def test_a_rank_that_asks_for_another_start_than_the_zygotes_starts_cold(
    zygote: Path, tmp_path: Path
) -> None:
    """glibc reads MALLOC_* as a process starts: a fork would keep the zygote's, so the client
    execs Python itself, and the rank is the client's own process."""
    p = rank(zygote, tmp_path, "exit", "5", umask=0o027, MALLOC_ARENA_MAX="1")
    out, _ = p.communicate(timeout=30)
    assert p.returncode == 5
    said = f"cwd={tmp_path} path={[str(tmp_path), str(ROOT)]} x=42 argv=['exit', '5'] mask=27"
    assert out == f"{said} pid={p.pid}\n"


def test_a_warm_rank_killed_by_a_signal_is_seen_so(zygote: Path, tmp_path: Path) -> None:
    p = rank(zygote, tmp_path, "kill", str(int(signal.SIGKILL)))
    p.communicate(timeout=30)
    assert p.returncode == -signal.SIGKILL


def test_a_signal_to_the_client_reaches_the_rank_and_the_rank_ends_with_its_client(
    zygote: Path, tmp_path: Path
) -> None:
    p = rank(zygote, tmp_path, "wait")
    assert p.stdout is not None
    p.stdout.readline()
    p.send_signal(signal.SIGTERM)
    assert p.stdout.read() == "term\n" and p.wait(timeout=30) == 7
    p = rank(zygote, tmp_path, "wait")
    assert p.stdout is not None
    pid = int(p.stdout.readline().split(" pid=")[1])
    p.kill()
    p.wait(timeout=30)
    wait_for("the rank to end with its client", lambda: not Path(f"/proc/{pid}").exists(), 30)


def test_what_a_warm_rank_leaves_behind_is_ended(zygote: Path, tmp_path: Path) -> None:
    """A cold rank's orphans go to its launcher, which ends them; a warm one's to the zygote."""
    p = rank(zygote, tmp_path, "orphan")
    out, _ = p.communicate(timeout=30)
    child = int(out.split("child=")[1])
    assert p.returncode == 0
    wait_for("the orphan to be ended", lambda: not Path(f"/proc/{child}").exists(), 15)


def test_a_rank_whose_zygote_is_gone_starts_cold(tmp_path: Path) -> None:
    p = rank(tmp_path / "gone.sock", tmp_path, "exit", "4")
    out, _ = p.communicate(timeout=30)
    assert p.returncode == 4 and out.endswith(f" pid={p.pid}\n")


@pytest.mark.parametrize(
    "key, value, cold",
    [
        ("MALLOC_MMAP_THRESHOLD_", "131072", False),  # applied in the fork with mallopt
        ("MALLOC_MMAP_THRESHOLD_", "128k", True),  # not a number the fork would apply: cold
        ("MALLOC_ARENA_MAX", "1", True),
        ("OMP_NUM_THREADS", "3", False),  # applied with torch.set_num_threads
        ("OMP_NUM_THREADS", "4,2", True),
        ("PYTHONPATH", "/somewhere", False),  # applied to sys.path
        ("LD_PRELOAD", "/lib/x.so", True),
    ],
)
def test_which_start_time_variables_start_a_rank_cold(key: str, value: str, cold: bool) -> None:
    from tests.warm import zygote

    env = {k: v for k, v in {**zygote.START_ENV, **zygote.ADDED}.items() if k != key}
    assert (zygote.differs({**env, key: value}) == [key]) is cold
