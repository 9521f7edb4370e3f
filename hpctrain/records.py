"""The run-directory format: one directory per run, never shared between runs.

    config.yaml          the resolved configuration (what the ranks read)
    plan.json            the launch plan (command, environment, batch sizes)
    env.json             versions, host names, MPI flavour, Horovod build (rank 0)
    steps-rank{R}.jsonl  one timing record per step and rank
    summary.json         rank 0's aggregate over all ranks, written last
    error-rank{R}.json   written by a rank that failed, before it exits
    logs/rank{R}.log     everything a rank printed (written by the local launcher)
    model.pt             final weights (rank 0), when train.save_model is true

Writes are atomic (temporary file + rename), so a reader never sees half a file.
"""
from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterator

CONFIG = "config.yaml"
PLAN = "plan.json"
ENV = "env.json"
SUMMARY = "summary.json"
MODEL = "model.pt"
LOGS = "logs"


def steps_file(rank: int) -> str:
    return f"steps-rank{rank}.jsonl"


def error_file(rank: int) -> str:
    return f"error-rank{rank}.json"


def log_file(rank: int) -> str:
    return f"{LOGS}/rank{rank}.log"


def write_atomic(path: Path, data: bytes | str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = data.encode() if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_json(path: Path, obj: Any) -> None:
    write_atomic(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def read_json(path: Path) -> Any:
    return json.loads(Path(path).read_text())


def iter_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    with open(path) as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def read_new_lines(path: Path, offset: int) -> tuple[list[str], int]:
    """Complete lines appended to `path` since byte `offset`, and the new offset; a partial last
    line waits for the next call. For following logs that other processes are writing."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return [], offset
    cut = data.rfind(b"\n") + 1
    return data[:cut].decode(errors="replace").splitlines(), offset + cut


def first_error(run_dir: Path) -> dict[str, Any] | None:
    """The earliest error-rank{R}.json: the rank that failed first (the others were stopped)."""
    errors = read_errors(run_dir)
    return min(errors.values(), key=lambda e: e.get("time", 0)) if errors else None


def describe_error(err: dict[str, Any]) -> str:
    return f"{err.get('type')}: {err.get('message')} (on {err.get('host')})"


def read_errors(run_dir: Path) -> dict[int, dict[str, Any]]:
    """error-rank{R}.json files by rank."""
    out = {}
    for p in sorted(Path(run_dir).glob("error-rank*.json")):
        try:
            out[int(p.stem.removeprefix("error-rank"))] = read_json(p)
        except (ValueError, json.JSONDecodeError):
            continue
    return out
