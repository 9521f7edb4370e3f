"""What a run directory gives the trackers: its parameters, its complete steps (every rank's
record of the step exists) and its summary. Reads records only; nothing here writes."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpctrain import bounded, records
from hpctrain.config import yaml_bounds
from hpctrain.errors import RecordError
from hpctrain.records.preflight import excluded
from hpctrain.records.restarts import read_restarts

PARAM_MAX = 500  # characters of one parameter value (MLflow's limit is larger; keep them readable)


@dataclass
class StepRow:
    """One step as the trackers show it: rank 0's loss and throughput, every rank's phases."""

    step: int
    loss: float
    samples_per_s: float
    per_rank: dict[int, dict[str, float]] = field(default_factory=dict)  # rank -> {phase: seconds}


def _json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(bounded.read_bytes(path, bounded.RECORD))
    except (OSError, ValueError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}


def flatten(tree: Any, prefix: str = "") -> dict[str, str]:
    if isinstance(tree, dict):
        out: dict[str, str] = {}
        for k, v in tree.items():
            out.update(flatten(v, f"{prefix}{k}."))
        return out
    return {prefix.rstrip("."): str(tree)[:PARAM_MAX]}


def params_of(run_dir: Path, overrides: list[str] | None = None) -> dict[str, str]:
    """The resolved config (flattened) and the facts of the run: world size, nodes, engine,
    parallelism, precision, versions, and the git commit of the code snapshot."""
    out: dict[str, str] = {}
    try:
        cfg = yaml_bounds.load(run_dir / records.CONFIG, bounded.TEXT)  # a bomb: BadYaml
        out.update({k: v for k, v in flatten(cfg).items() if v not in ("None", "[]", "{}")})
    except ValueError:
        pass
    plan, env, code = (
        _json(run_dir / records.PLAN),
        _json(run_dir / records.ENV),
        _json(run_dir / records.CODE),
    )
    summary = _json(run_dir / records.SUMMARY)
    facts = {
        "world_size": plan.get("world_size", summary.get("world_size")),
        "nodes": plan.get("nodes"),
        "launcher": plan.get("launcher"),
        "engine": summary.get("engine", env.get("engine")),
        "parallelism": summary.get("parallelism"),
        "precision": summary.get("precision"),
        "version.torch": env.get("torch"),
        "version.horovod": env.get("horovod"),
        "version.python": env.get("python"),
        "version.slurm": env.get("slurm"),  # what the job's nodes ran (rank.py asks scontrol)
        "code.commit": code.get("commit"),
        "code.dirty": code.get("dirty"),
        "overrides": " ".join(overrides) if overrides else None,
    }
    out.update({f"hpctrain.{k}": str(v)[:PARAM_MAX] for k, v in facts.items() if v is not None})
    return out


def step_rows(run_dir: Path, world: int, after: int) -> list[StepRow]:
    """Steps after `after` that every rank has recorded, in order (a partial last line, or a step
    one rank has not reached yet, waits for the next call)."""
    by_rank: dict[int, dict[int, records.StepRecord]] = {}
    for rank in range(world):
        try:
            recs = records.read_steps(run_dir / records.steps_file(rank))
        except RecordError:
            recs = []
        by_rank[rank] = {r.step: r for r in recs if r.step > after}
    common = sorted(set.intersection(*(set(v) for v in by_rank.values()))) if by_rank else []
    rows = []
    for step in common:
        recs_ = {rank: by_rank[rank][step] for rank in by_rank}
        busy = {rank: r.data_s + r.compute_s for rank, r in recs_.items()}
        slowest = max(busy.values())
        rows.append(
            StepRow(
                step,
                recs_[0].loss,
                recs_[0].samples_per_s,
                {
                    rank: {
                        "compute": r.compute_s,
                        "comm": r.comm_s,
                        "data": r.data_s,
                        "wait": slowest - busy[rank],  # for the slowest rank, in the collective
                    }
                    for rank, r in recs_.items()
                },
            )
        )
    return rows


def summary_metrics(run_dir: Path) -> dict[str, float]:
    """The run summary's figures (empty until the run has one)."""
    try:
        s = records.read(run_dir / records.SUMMARY, records.RunSummary)
    except RecordError:
        return {}
    out = {
        "samples_per_s": s.throughput_samples_per_s,
        "samples_per_s_per_rank": s.throughput_per_rank,
        "step_ms": 1e3 * s.step_s,
        "step_p95_ms": 1e3 * s.step_p95_s,
        "compute_share": s.compute_share,
        "comm_share": s.comm_share,
        "data_share": s.data_share,
        "first_loss": s.first_loss,
        "last_loss": s.last_loss,
        "peak_memory_mib": max(s.peak_memory_bytes, default=0) / 2**20,
    }
    if s.imbalance_s == s.imbalance_s:  # not NaN
        out["wait_ms"] = 1e3 * s.imbalance_s
    for key, figures in s.parts.items():  # each part's numbers, under its key: pipeline.bubble_s
        values = figures if isinstance(figures, dict) else vars(figures)
        out.update({f"{key}.{k}": float(v) for k, v in values.items() if type(v) in (int, float)})
    if s.restarts:  # records/restarts.py
        out.update(
            restarts=s.restarts,
            steps_redone=s.steps_redone,
            restart_node_hours_lost=s.restart_node_hours_lost,
        )
    bad = len(excluded(run_dir))  # nodes a pre-flight check judged bad (records/preflight.py)
    if bad:
        out["nodes_excluded"] = bad
    lost = sum(len(r.lost_nodes) for r in read_restarts(run_dir))  # nodes lost mid-run
    if lost:
        out["nodes_lost"] = lost
    cost = _json(run_dir / records.COST)
    for key in ("node_hours", "core_hours", "energy_j"):
        if isinstance(cost.get(key), int | float):
            out[key] = float(cost[key])
    return out


def world_of(run_dir: Path) -> int:
    plan = _json(run_dir / records.PLAN)
    job = _json(run_dir / records.JOB)
    return int(plan.get("world_size") or job.get("world_size") or 1)
