"""Reading SLURM's accounting and queue: small pure parsers over real `sacct -P` text, and one
function that runs the command."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass

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


def sacct(job_ids: list[str]) -> dict[str, JobState]:
    if not job_ids:
        return {}
    argv = ["sacct", "-X", "-P", "-n", "-o", ",".join(SACCT_FIELDS), "-j", ",".join(job_ids)]
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    except FileNotFoundError as e:
        raise LaunchError(
            "sacct not found: install slurm-client, or start the test cluster "
            "(bash slurm/start.sh) and export SLURM_CONF"
        ) from e
    if r.returncode != 0:
        raise LaunchError(f"sacct failed: {r.stderr.strip()}")
    return parse_sacct(r.stdout)
