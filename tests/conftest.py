"""Shared fixtures. Snapshots are refreshed only on request: pytest --update-snapshots."""

from __future__ import annotations

import os
import subprocess
import sys
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
