"""Creating a run directory and writing what every launcher writes before the ranks start."""

from __future__ import annotations

import itertools
import os
import shutil
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hpctrain import records
from hpctrain.config.plain_yaml import to_yaml
from hpctrain.config.run_file import PLANNED_KEY, digest
from hpctrain.config.schema import Config
from hpctrain.errors import LaunchError


def prepare_run_dir(run_dir: Path) -> Path:
    """Create the run directory; refuse one that already holds files (runs never share one).
    Two mkdir calls for a fresh one (a 10,000-point sweep makes 10,000)."""
    try:
        try:
            os.mkdir(run_dir)
        except FileNotFoundError:
            run_dir.mkdir(parents=True, exist_ok=True)
        except FileExistsError:
            if not run_dir.is_dir():
                raise LaunchError(f"run directory {run_dir} is a file; choose another run.dir") from None
            if any(run_dir.iterdir()):
                raise LaunchError(
                    f"run directory {run_dir} already exists and is not empty; "
                    "choose another run.dir (or leave it unset for a fresh dated one)"
                ) from None
        os.mkdir(run_dir / records.LOGS)
    except OSError as e:
        raise LaunchError(f"cannot create run directory {run_dir}: {e}") from e
    return run_dir


def claim_fresh(base: Path) -> Path:
    """Create a new directory: `base`, or base-2, base-3, ... when it is taken (two commands
    started in the same second). mkdir is atomic, so no two commands ever get the same one."""
    for n in itertools.count(1):
        path = base if n == 1 else base.with_name(f"{base.name}-{n}")
        try:
            path.mkdir(parents=True)
            return path
        except FileExistsError:
            continue
        except OSError as e:
            raise LaunchError(f"cannot create directory {path}: {e}") from e
    raise AssertionError("unreachable")


@contextmanager
def undone_if_refused(dirs: Sequence[Path]) -> Iterator[list[Path]]:
    """Those of `dirs` that do not exist yet, and those the block adds to the list it is given
    (a directory it claimed), are removed again if the block is refused (LaunchError: sbatch
    refused the first job, mpirun is missing) before a job was started in them: a refused command
    leaves nothing behind. A directory holding a job.json is a started run's, and is kept."""
    made = [d for d in dict.fromkeys(dirs) if not d.exists()]
    try:
        yield made
    except LaunchError:
        if not any(d.is_dir() and any(d.rglob(records.JOB)) for d in made):
            for d in made:
                shutil.rmtree(d, ignore_errors=True)
        raise


def write_run_files(run_dir: Path, cfg: Config, plan: Any) -> None:
    """The code snapshot (if the run takes one), config.yaml (what the ranks read) and plan.json,
    for every launcher."""
    from hpctrain.workload.code import CODE_DIR_VAR, snapshot, snapshot_on

    if snapshot_on(cfg):
        snapshot(Path(str(cfg.code.dir)), Path(plan.env[CODE_DIR_VAR]), list(cfg.code.include))
    text = to_yaml(cfg)
    records.write_atomic(run_dir / records.CONFIG, text)
    # the ranks read config.yaml only as planned (config/run_file.py)
    records.write_json(run_dir / records.PLAN, {**plan.to_dict(), PLANNED_KEY: digest(text)}, indent=None)
    if getattr(plan, "container", None):
        from hpctrain.launch.container.plan import stage

        stage(cfg, plan.container, run_dir)
