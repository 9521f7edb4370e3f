"""Reading SLURM's accounting and queue: small pure parsers over real `sacct -P` text, and one
function that runs the command."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, replace

from ..errors import LaunchError
from .base import DONE

SACCT_FIELDS = ("JobID", "JobName", "State", "NNodes", "Elapsed", "ExitCode", "NodeList")


@dataclass(frozen=True)
class JobState:
    job_id: str  # "123", or "123_4" for an array task
    name: str
    state: str  # first word of sacct's State ("CANCELLED by 0" -> "CANCELLED")
    nodes: int
    elapsed: str
    exit_code: str
    nodelist: str

    @property
    def done(self) -> bool:
        return self.state in DONE


def parse_sacct(text: str) -> dict[str, JobState]:
    """`sacct -X -P -n -o <SACCT_FIELDS>` output -> states by job id (allocations only)."""
    out: dict[str, JobState] = {}
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) != len(SACCT_FIELDS) or "." in parts[0]:
            continue
        jid, name, state, nodes, elapsed, code, nodelist = parts
        out[jid] = JobState(
            jid,
            name,
            state.split()[0] if state else "UNKNOWN",
            int(nodes) if nodes.isdigit() else 0,
            elapsed,
            code,
            nodelist,
        )
    return out


def _task_in(task: str, spec: str) -> bool:
    """Whether array task `task` is in sacct's task list `spec`, e.g. "[0-15]", "[3-5,7%2]"."""
    if not task.isdigit():
        return False
    for part in spec.strip("[]").split("%")[0].split(","):
        lo, _, hi = part.partition("-")
        if lo.isdigit() and (hi or lo).isdigit() and int(lo) <= int(task) <= int(hi or lo):
            return True
    return False


def with_array_tasks(requested: list[str], states: dict[str, JobState]) -> dict[str, JobState]:
    """Array tasks that never started have no record of their own: sacct shows the array's
    unsplit rest as one record, "123" (none split off yet) or "123_[4-15]". Give each such task
    that record's state (a pending array cancelled as a whole is CANCELLED, not pending forever)."""
    out = dict(states)
    for jid in requested:
        array, _, task = jid.partition("_")
        if jid in out or not task:
            continue
        rest = [
            s
            for k, s in states.items()
            if k == array or (k.startswith(f"{array}_[") and _task_in(task, k[len(array) + 1 :]))
        ]
        if rest:
            out[jid] = replace(rest[0], job_id=jid)
    return out


def sacct(job_ids: list[str]) -> dict[str, JobState]:
    if not job_ids:
        return {}
    arrays = sorted({j.split("_")[0] for j in job_ids if "_" in j})  # for their unsplit rest
    query = ",".join([*job_ids, *arrays])
    argv = ["sacct", "-X", "-P", "-n", "-o", ",".join(SACCT_FIELDS), "-j", query]
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    except FileNotFoundError as e:
        raise LaunchError(
            "sacct not found: install slurm-client, or start the test cluster "
            "(bash slurm/start.sh) and export SLURM_CONF"
        ) from e
    if r.returncode != 0:
        raise LaunchError(f"sacct failed: {r.stderr.strip()}")
    return with_array_tasks(job_ids, parse_sacct(r.stdout))
