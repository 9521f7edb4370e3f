"""A study's run summaries, read once: a compact table beside the study (.summaries-cache.json),
each row keyed by its summary file's identity (inode, size, modification and change times), so
re-analysing 10,000 runs reads one file instead of 10,000 and a record that changed in any way
is read again. The table keeps what the analysis reads: each summary with only the ranks it reads (see
compact); a row that does not check out is read from its record."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hpctrain import bounded, records
from hpctrain.errors import RecordError
from hpctrain.records.parts import stage_of

CACHE = ".summaries-cache.json"
VERSION = 3  # 2: pipeline transfer and schedule times; 3: the ranks' parts


def stamp(st: os.stat_result) -> list[int]:
    """What changes whenever a file's content may have: a rename (atomic writes) changes the inode,
    an edit in place the size or the change time."""
    return [st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def kept(
    ranks: list[Any], state: Callable[[Any], float], peak: Callable[[Any], float], stage: Callable[[Any], int]
) -> list[int]:
    """Which of a summary's ranks the analysis reads, by position: the one holding the most state,
    and per pipeline stage the one with the highest peak memory."""
    keep = {max(range(len(ranks)), key=lambda i: state(ranks[i]))}
    for st in {stage(r) for r in ranks}:
        keep.add(max((i for i, r in enumerate(ranks) if stage(r) == st), key=lambda i: peak(ranks[i])))
    return sorted(keep)


def compact(s: records.RunSummary) -> records.RunSummary:
    """The summary with the ranks the analysis reads (see kept), so that state_bytes and
    peak_by_stage agree with the full record's."""
    if not s.per_rank:
        return s
    keep = kept(s.per_rank, lambda r: r.state_bytes, lambda r: r.peak_memory_bytes, stage_of)
    return dataclasses.replace(s, per_rank=[s.per_rank[i] for i in keep])


def read_compact(path: Path) -> records.RunSummary:
    """compact(records.read(path)) without typing the ranks it drops (a summary of 128 ranks is
    three quarters per-rank entries). Entries that do not look like ranks are left to the typed
    reader, which names what is wrong."""
    data = records.read_json(path)
    try:
        ranks = data["per_rank"]
        keep = kept(
            ranks,
            lambda r: r["param_bytes"] + r["grad_bytes"] + r["optimizer_bytes"],
            lambda r: r["peak_memory_bytes"],
            stage_of,
        )
        data = {**data, "per_rank": [ranks[i] for i in keep]}
    except (KeyError, TypeError, ValueError, IndexError, AttributeError):
        pass  # the typed read of the whole record says why
    try:
        return compact(records.from_dict(records.RunSummary, data))
    except RecordError as e:
        raise RecordError(f"{path}: not a valid RunSummary record: {e}") from None


def read_cache(study_dir: Path) -> dict[str, Any]:
    try:
        data = json.loads(bounded.read_bytes(study_dir / CACHE, bounded.RECORD))
    except (OSError, ValueError, RecursionError):
        return {}
    if not isinstance(data, dict) or data.get("version") != VERSION or not isinstance(data.get("rows"), dict):
        return {}
    return data["rows"]


def write_cache(study_dir: Path, rows: dict[str, Any]) -> None:
    """Best effort: a study on a read-only file system is analysed all the same."""
    try:
        records.write_atomic(study_dir / CACHE, json.dumps({"version": VERSION, "rows": rows}))
    except OSError:
        pass


def container_line(run_dir: Path) -> str | None:
    """One line on the image the run ran in (container.json), or None."""
    try:
        c = records.read_json(run_dir / records.CONTAINER)
    except (RecordError, OSError):
        return None
    if not isinstance(c, dict):
        return None
    digest = f"digest {c['digest']}" if c.get("digest") else "digest unknown (not built by hpctrain)"
    return f"{c.get('runtime')} ({c.get('version') or 'version unknown'}), image {c.get('image')}, {digest}"


def read_fresh(run_dir: Path, st: os.stat_result) -> tuple[dict[str, Any], records.RunSummary | None]:
    """The run's cache row, read from its record, and the compact summary it holds (None for a
    record that is no summary): the caller need not build the summary again from the row."""
    summary = None
    try:
        summary = read_compact(run_dir / records.SUMMARY)
        row: dict[str, Any] = {"summary": records.to_dict(summary)}
    except RecordError as e:
        row = {"error": str(e)}
    return {"stamp": stamp(st), "container": container_line(run_dir), **row}, summary


def fresh_row(run_dir: Path, st: os.stat_result) -> dict[str, Any]:
    return read_fresh(run_dir, st)[0]


def from_row(row: Any) -> tuple[records.RunSummary | None, str | None]:
    """The row's summary (or its recorded error); RecordError if the row itself is damaged."""
    if not isinstance(row, dict):
        raise RecordError("a cache row is not an object")
    if "error" in row:
        return None, str(row["error"])
    return records.from_dict(records.RunSummary, row.get("summary")), None


def load(
    study_dir: Path, run_dirs: list[tuple[str, Path]]
) -> tuple[dict[str, Any], list[str], dict[str, records.RunSummary]]:
    """Each run's row ({"summary"|"error", "container"}), by its recorded name; runs without a
    summary are listed as missing; and the summaries read from their records this time, already
    typed. The cache is rewritten when any row changed."""
    cached = read_cache(study_dir)
    rows: dict[str, Any] = {}
    missing: list[str] = []
    typed: dict[str, records.RunSummary] = {}
    changed = False
    for name, run_dir in run_dirs:
        try:
            st = os.stat(run_dir / records.SUMMARY)
        except FileNotFoundError:
            missing.append(name)
            continue
        except OSError as e:
            rows[name] = {
                "stamp": [],
                "container": None,
                "error": f"{run_dir / records.SUMMARY}: {e.strerror}",
            }
            continue
        hit = cached.get(name)
        if isinstance(hit, dict) and hit.get("stamp") == stamp(st):
            rows[name] = hit
        else:
            rows[name], summary = read_fresh(run_dir, st)
            changed = True
            if summary is not None:
                typed[name] = summary
    if changed or len(cached) != len(rows):
        write_cache(study_dir, rows)
    return rows, missing, typed


Found = list[tuple[str, records.RunSummary]]


def summaries(
    study_dir: Path, run_dirs: list[tuple[str, Path]]
) -> tuple[Found, list[str], list[str], list[str]]:
    """((name, summary) pairs, missing, corrupt, container lines) of a study's runs, through the
    cache."""
    rows, missing, typed = load(study_dir, run_dirs)
    runs, corrupt, containers = [], [], []
    where = dict(run_dirs)
    for name, row in rows.items():
        try:
            summary, error = (typed[name], None) if name in typed else from_row(row)
        except RecordError:  # a damaged row: the record itself decides
            row = fresh_row(where[name], os.stat(where[name] / records.SUMMARY))
            summary, error = from_row(row)
        if row.get("container"):
            containers.append(str(row["container"]))
        if summary is None:
            missing.append(name)
            corrupt.append(str(error))
        else:
            runs.append((name, summary))
    return runs, missing, corrupt, containers
