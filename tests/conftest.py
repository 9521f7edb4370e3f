"""Shared fixtures. Snapshots are refreshed only on request: pytest --update-snapshots."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SNAPSHOTS = Path(__file__).parent / "snapshots"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-snapshots",
        action="store_true",
        help="rewrite tests/snapshots/* from the current output instead of comparing",
    )


@pytest.fixture
def snapshot(request: pytest.FixtureRequest):
    """snapshot(name, text): compare text with tests/snapshots/name (or rewrite it on request)."""
    update = request.config.getoption("--update-snapshots")

    def check(name: str, text: str) -> None:
        path = SNAPSHOTS / name
        if update:
            path.write_text(text)
            return
        assert path.exists(), f"no snapshot {path}; create it with: pytest --update-snapshots"
        expected = path.read_text()
        assert text == expected, (
            f"{name} differs from the recorded snapshot; if the change is "
            "intended, refresh it with: pytest --update-snapshots"
        )

    return check


def hpctrain(*args: str, timeout: float = 600, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run the real CLI in a subprocess (no progress bar; output captured)."""
    env = dict(os.environ, COLUMNS="200", TERM="dumb")
    return subprocess.run(
        [sys.executable, "-m", "hpctrain.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd or ROOT,
        env=env,
    )


@pytest.fixture
def run_cli():
    return hpctrain


def processes_of(run_dir: Path) -> list[str]:
    """Live processes (not zombies) whose command line names the run directory."""
    out = subprocess.run(["ps", "-ww", "-eo", "pid,stat,args"], capture_output=True, text=True).stdout
    return [
        line
        for line in out.splitlines()[1:]
        if str(run_dir) in line and "ps -eo" not in line and line.split()[1][0] != "Z"
    ]


def wait_for(what: str, check: Callable[[], object], timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0
