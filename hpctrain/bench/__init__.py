"""Benchmarks: each prints ratios measured in one run, never absolute claims."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from hpctrain.errors import LaunchError
from hpctrain.lifeline import with_lifeline


def hpctrain_run(run_dir: Path, *overrides: str) -> list[str]:
    """The command line of one `hpctrain run` a benchmark measures, into run_dir."""
    return [sys.executable, "-m", "hpctrain.cli", "run", "--no-progress", f"run.dir={run_dir}", *overrides]


def run_checked(
    argv: list[str], what: str = "benchmark run", timeout_s: float = 1800, cwd: Path | None = None
) -> str:
    """Run one command a benchmark needs, ending with this process (with_lifeline); its output,
    or LaunchError with the command and the end of what it wrote to stderr."""
    r = subprocess.run(with_lifeline(argv), capture_output=True, text=True, timeout=timeout_s, cwd=cwd)
    if r.returncode != 0:
        raise LaunchError(f"{what} failed ({r.returncode}): {' '.join(argv)}\n{r.stderr[-2000:]}")
    return r.stdout
