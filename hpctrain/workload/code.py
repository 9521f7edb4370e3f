"""The user's code: on every rank's import path, and snapshotted for queued jobs.

A SLURM job may start hours after `sbatch`, and a requeued one starts again later still; if it
imported the live code directory, an edit made meanwhile would change what it runs (and a
requeue would resume with different code). So at submission the code directory's git-tracked
files (or code.include's globs) are copied into the run or sweep directory, and the job runs that
copy; code.json records the commit, whether the tree was dirty, and code.diff holds the diff.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from hpctrain import records
from hpctrain.config.schema import Config
from hpctrain.errors import LaunchError

SNAPSHOT_DIR = "code"  # in the run directory, or in the sweep directory for all its runs
CODE_DIR_VAR = "HPCTRAIN_CODE_DIR"  # where each rank finds the user's code (the snapshot, if any)


def snapshot_on(cfg: Config) -> bool:
    if not cfg.user_code:
        return False
    if cfg.code.snapshot is not None:
        return cfg.code.snapshot
    return bool(cfg.cluster.snapshots_code)


def code_location(cfg: Config, home: Path) -> str | None:
    """Where the ranks import user code from: the snapshot in `home`, or code.dir (pure)."""
    if not cfg.user_code:
        return None
    return str(home / SNAPSHOT_DIR) if snapshot_on(cfg) else str(cfg.code.dir)


def script_location(cfg: Config, code: str | None) -> str | None:
    """The script the ranks run: its copy in the snapshot when there is one."""
    if not cfg.script.path:
        return None
    if code is None or code == cfg.code.dir:
        return cfg.script.path
    return str(Path(code) / Path(cfg.script.path).resolve().relative_to(Path(str(cfg.code.dir)).resolve()))


def activate(environ: dict[str, str] | os._Environ[str] = os.environ) -> str | None:
    """Rank side: the code directory first on sys.path and on PYTHONPATH (for any process the rank
    starts, such as DataLoader workers)."""
    code = environ.get(CODE_DIR_VAR)
    if not code:
        return None
    if code not in sys.path:
        sys.path.insert(0, code)
    old = environ.get("PYTHONPATH")
    environ["PYTHONPATH"] = code if not old else f"{code}{os.pathsep}{old}"
    return code


def _git(src: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", str(src), *args], capture_output=True, text=True, timeout=120)


NOT_GIT = (
    "is not a git work tree, so hpctrain does not know which files are your code; "
    "set code.include (e.g. code.include='[\"**/*.py\"]') or code.snapshot=false"
)


@functools.cache
def git_top(src: Path) -> str | None:
    """The git work tree `src` is in; None if it is in none (or git is missing). Asked once per
    directory: a sweep's points all check the same one before anything is created."""
    try:
        top = _git(src, "rev-parse", "--show-toplevel")
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return None
    return top.stdout.strip() if top.returncode == 0 else None


def in_snapshot(src: Path, include: list[str], path: Path) -> bool:
    """Would a snapshot of `src` hold `path` (a file inside it)? Asked before anything is created:
    a script the user has not `git add`ed would be missing from the job, which would fail on the
    nodes after its wait in the queue."""
    rel = path.resolve().relative_to(src.resolve())
    if include:
        return any(rel in {p.relative_to(src) for p in src.glob(g)} for g in include)
    if git_top(src) is None:
        return True  # refused on its own (NOT_GIT)
    return _git(src, "ls-files", "--error-unmatch", "--", str(rel)).returncode == 0


def files_to_copy(src: Path, include: list[str]) -> tuple[list[Path], dict[str, Any]]:
    """Relative paths to copy and what git says about the tree (commit, dirty) if it is one."""
    info: dict[str, Any] = {"source": str(src), "git": False}
    if include:
        found = sorted({p.relative_to(src) for g in include for p in src.glob(g) if p.is_file()})
        return found, info
    if git_top(src) is None:
        raise LaunchError(f"code.dir={src} {NOT_GIT}")
    listed = _git(src, "ls-files", "-z", "--cached", ".")
    files = sorted(Path(f) for f in listed.stdout.split("\0") if f and (src / f).is_file())
    untracked = _git(src, "ls-files", "-z", "--others", "--exclude-standard", ".")
    head = _git(src, "rev-parse", "HEAD")
    status = _git(src, "status", "--porcelain", "--untracked-files=no", ".")
    info.update(
        git=True,
        commit=head.stdout.strip() if head.returncode == 0 else None,
        dirty=bool(status.stdout.strip()),
        # not copied: a module the user has not `git add`ed yet is missing from the job
        untracked=sum(1 for f in untracked.stdout.split("\0") if f),
    )
    return files, info


def snapshot(src: Path, dest: Path, include: list[str]) -> dict[str, Any]:
    """Copy the code into `dest` (once: a sweep's runs share it); returns code.json's content."""
    record = dest.parent / records.CODE
    if dest.exists() and record.exists():
        taken = records.read_json(record)
        if taken.get("source") != str(src):
            raise LaunchError(
                f"the runs of a sweep share one code snapshot ({dest}, of {taken.get('source')}); "
                f"this one asks for code.dir={src}: sweep over one code.dir at a time"
            )
        return taken
    files, info = files_to_copy(src, include)
    home = dest.parent.resolve()  # a run directory inside code.dir is not code: never copy it
    files = [f for f in files if not (src / f).resolve().is_relative_to(home)]
    if not files:
        raise LaunchError(f"no files to snapshot in code.dir={src} (code.include={include})")
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        for rel in files:
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src / rel, tmp / rel)
        tmp.replace(dest)
    except OSError as e:
        raise LaunchError(f"cannot snapshot code.dir={src} into {dest}: {e}") from e
    info.update(snapshot=str(dest), files=len(files))
    if info.get("dirty"):
        diff = _git(src, "diff", "HEAD", "--", ".")
        records.write_atomic(dest.parent / records.CODE_DIFF, diff.stdout)
        info["diff"] = records.CODE_DIFF
    records.write_json(record, info)
    return info
