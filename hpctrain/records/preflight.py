"""preflight.json: one line per pre-flight check of a run (train/preflight.py writes it on rank
0), each with every rank's probes and every node's verdict. A run resubmitted without its bad
nodes checks again and adds a line."""

from __future__ import annotations

from pathlib import Path

from hpctrain.records import read_jsonl

PREFLIGHT = "preflight.json"


def checks(run_dir: Path) -> list[dict[str, object]]:
    """The run's checks, oldest first; a damaged line (a writer killed mid-line) is skipped."""
    docs = read_jsonl(run_dir / PREFLIGHT)
    return [d for d in docs if isinstance(d, dict) and isinstance(d.get("verdicts"), list)]


def bad_hosts(check: dict[str, object]) -> list[str]:
    verdicts = check.get("verdicts")
    return (
        [str(v["host"]) for v in verdicts if isinstance(v, dict) and v.get("bad")]
        if isinstance(verdicts, list)
        else []
    )


def verdicts_text(check: dict[str, object]) -> str:
    """One check's verdicts in a line: each node good, or BAD and why."""
    verdicts = check.get("verdicts")
    if not isinstance(verdicts, list):
        return "no verdicts"
    return "; ".join(
        f"{v.get('host')} BAD ({v.get('why')})" if v.get("bad") else f"{v.get('host')} good"
        for v in verdicts
        if isinstance(v, dict)
    )


def excluded(run_dir: Path) -> list[str]:
    """Every node some check of the run judged bad, in the order they were found."""
    return list(dict.fromkeys(h for c in checks(run_dir) for h in bad_hosts(c)))


def reference_checks(path: Path) -> list[dict[str, object]]:
    """The checks of an earlier run (PATH/preflight.json) or of every run of a study or sweep
    (PATH/*/preflight.json): cluster.preflight.reference."""
    found = checks(path)
    for run in sorted(path.glob(f"*/{PREFLIGHT}")):
        found += checks(run.parent)
    return found
