"""The environment a script's framework expects, derived from the launcher's variables.

torch.distributed's env:// rendezvous reads RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and
MASTER_PORT (what torchrun sets); OpenMPI's mpirun sets OMPI_COMM_WORLD_*, srun SLURM_*. Horovod
over MPI needs nothing more; over Gloo it gets its HOROVOD_* variables from train/comm.py.
Values the user set (cluster.env) are kept.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, MutableMapping

from ..train.comm import CommError

OMPI = (
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
)
SLURM = ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE")
PORT_BASE, PORT_SPAN = 20000, 20000  # SLURM jobs: the master port follows the job id


RANK_VARS = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID", "HOROVOD_RANK")


def launcher_rank(environ: Mapping[str, str]) -> int | None:
    """This process's rank as its launcher set it, known even before Horovod starts."""
    for var in RANK_VARS:
        if environ.get(var, "").isdigit():
            return int(environ[var])
    return None


def launcher_world(environ: Mapping[str, str]) -> int | None:
    """The world size the launcher started, where it says (for the world-size check)."""
    for var in ("OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS"):
        if environ.get(var, "").isdigit():
            return int(environ[var])
    return None


def torch_env(environ: Mapping[str, str], first_node: str | None = None) -> dict[str, str]:
    """RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT for this process."""
    names = OMPI if "OMPI_COMM_WORLD_RANK" in environ else SLURM
    missing = [v for v in names if v not in environ]
    if missing:
        raise CommError(f"cannot tell this rank's place: the launcher did not set {', '.join(missing)}")
    rank, size, local, local_size = (environ[v].split("(")[0] for v in names)  # SLURM: "2(x3)"
    out = {"RANK": rank, "WORLD_SIZE": size, "LOCAL_RANK": local, "LOCAL_WORLD_SIZE": local_size}
    if names is SLURM:
        job = environ.get("SLURM_JOB_ID", "0")
        out["MASTER_ADDR"] = first_node or "127.0.0.1"
        out["MASTER_PORT"] = str(PORT_BASE + int(job) % PORT_SPAN if job.isdigit() else PORT_BASE)
    else:
        out["MASTER_ADDR"] = "127.0.0.1"
    return {k: v for k, v in out.items() if k not in environ}  # the user's own settings win


def slurm_first_node(environ: Mapping[str, str]) -> str | None:
    """The allocation's first node (rank 0 runs there: srun places tasks in block order)."""
    nodelist = environ.get("SLURM_JOB_NODELIST")
    if not nodelist:
        return None
    try:
        r = subprocess.run(
            ["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    hosts = r.stdout.split()
    return hosts[0] if r.returncode == 0 and hosts else None


def export_torch_env(environ: MutableMapping[str, str] = os.environ) -> None:
    """Set this process's torch.distributed variables (under srun, the store is on the
    allocation's first node; under mpirun, on this host)."""
    under_srun = "SLURM_PROCID" in environ and "OMPI_COMM_WORLD_RANK" not in environ
    environ.update(torch_env(environ, slurm_first_node(environ) if under_srun else None))
