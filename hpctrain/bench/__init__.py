"""Benchmarks: each prints ratios measured in one run, never absolute claims."""

from __future__ import annotations

import sys
from pathlib import Path


def hpctrain_run(run_dir: Path, *overrides: str) -> list[str]:
    """The command line of one `hpctrain run` a benchmark measures, into run_dir."""
    return [sys.executable, "-m", "hpctrain.cli", "run", "--no-progress", f"run.dir={run_dir}", *overrides]
