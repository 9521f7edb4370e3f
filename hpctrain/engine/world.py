"""Where this rank stands in the world its launcher started, read from the launcher's variables.

One table says which variables each launcher sets (OpenMPI's mpirun: OMPI_COMM_WORLD_*; srun:
SLURM_*). From it come torch.distributed's env:// variables (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR, MASTER_PORT: what torchrun sets) and Horovod's Gloo identity (HOROVOD_RANK, ...:
what horovodrun's gloo_run sets). Values the user set (cluster.env) are kept.
"""

from __future__ import annotations

import math
import os
import socket
import subprocess
import sys
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass


class CommError(RuntimeError):
    """The engine's view of the world does not match what the launcher promised."""


@dataclass(frozen=True)
class RankInfo:
    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int
    hostname: str


@dataclass(frozen=True)
class Place:
    """The variables one launcher sets for each process it starts."""

    rank: str
    size: str
    local_rank: str
    local_size: str

    @property
    def names(self) -> tuple[str, str, str, str]:
        return (self.rank, self.size, self.local_rank, self.local_size)


MPIRUN = Place(
    "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"
)
SRUN = Place("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE")
TORCHRUN = Place("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")  # also hpctrain's spawn
RANK_VARS = (MPIRUN.rank, "PMIX_RANK", SRUN.rank, "HOROVOD_RANK", TORCHRUN.rank)
PORT_BASE, PORT_SPAN = 20000, 20000  # SLURM jobs: the master port follows the job id


def launcher_place(environ: Mapping[str, str]) -> Place:
    """mpirun's variables when mpirun started this process (also inside a SLURM job), else srun's,
    else torchrun's (hpctrain's spawn sets them too)."""
    if MPIRUN.rank in environ:
        return MPIRUN
    if SRUN.rank not in environ and TORCHRUN.rank in environ:
        return TORCHRUN
    return SRUN


def launcher_rank(environ: Mapping[str, str]) -> int | None:
    """This process's rank as its launcher set it, known even before any engine starts."""
    for var in RANK_VARS:
        if environ.get(var, "").isdigit():
            return int(environ[var])
    return None


def launcher_local_rank(environ: Mapping[str, str]) -> int:
    """This process's rank on its node: LOCAL_RANK (torchrun and hpctrain's spawn set it), else
    mpirun's or srun's variable; 0 where no launcher says (a single process)."""
    for var in ("LOCAL_RANK", MPIRUN.local_rank, SRUN.local_rank):
        if environ.get(var, "").isdigit():
            return int(environ[var])
    return 0


def launcher_world(environ: Mapping[str, str]) -> int | None:
    """The world size the launcher started, where it says (for the world-size check)."""
    for var in (MPIRUN.size, SRUN.size, TORCHRUN.size):
        if environ.get(var, "").isdigit():
            return int(environ[var])
    return None


def place_values(environ: Mapping[str, str], need: str) -> tuple[Place, tuple[int, int, int, int]]:
    """(rank, size, local rank, local size) as the launcher set them; `need` says who asks."""
    place = launcher_place(environ)
    missing = [v for v in place.names if v not in environ]
    if missing:
        raise CommError(f"{need} needs a launcher that sets {', '.join(missing)} (mpirun, srun or spawn)")
    r, s, lr, ls = (int(environ[v].split("(")[0]) for v in place.names)  # SLURM: "2(x3)"
    return place, (r, s, lr, ls)


def torch_env(environ: Mapping[str, str], first_node: str | None = None) -> dict[str, str]:
    """RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT for this process."""
    place, values = place_values(environ, "torch.distributed")
    out = dict(zip(("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"), map(str, values)))
    if place is SRUN:
        job = environ.get("SLURM_JOB_ID", "0")
        out["MASTER_ADDR"] = first_node or "127.0.0.1"
        out["MASTER_PORT"] = str(PORT_BASE + int(job) % PORT_SPAN if job.isdigit() else PORT_BASE)
    else:
        out["MASTER_ADDR"] = "127.0.0.1"
    return {k: v for k, v in out.items() if k not in environ}  # the user's own settings win


def slurm_first_node(environ: Mapping[str, str]) -> str | None:
    """The step's first node (rank 0 runs there: srun places tasks in block order); a step on
    the nodes left after a loss (an elastic restart) may not hold the allocation's first."""
    nodelist = environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST")
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
    under_srun = launcher_place(environ) is SRUN and SRUN.rank in environ
    environ.update(torch_env(environ, slurm_first_node(environ) if under_srun else None))


def gloo_env(environ: Mapping[str, str]) -> dict[str, str]:
    """Horovod's Gloo identity variables for this process, from its launcher's variables."""
    _, (rank, size, local_rank, local_size) = place_values(environ, "backend=gloo")
    host = environ.get("HPCTRAIN_GLOO_HOSTNAME") or environ.get("SLURMD_NODENAME") or socket.gethostname()
    # mpirun --map-by slot and srun place consecutive ranks on one host: hosts are rank // local_size
    return {
        "HOROVOD_RANK": str(rank),
        "HOROVOD_SIZE": str(size),
        "HOROVOD_LOCAL_RANK": str(local_rank),
        "HOROVOD_LOCAL_SIZE": str(local_size),
        "HOROVOD_CROSS_RANK": str(rank // local_size),
        "HOROVOD_CROSS_SIZE": str(size // local_size),
        "HOROVOD_HOSTNAME": host,
    }


# Horovod's own bound on the Gloo rendezvous (horovod/common/gloo/gloo_context.cc; horovodrun
# --gloo-timeout-seconds): every rank must reach it within this long of the first
HOROVOD_GLOO_DEFAULT_S = 30


def gloo_timeout_env(environ: Mapping[str, str], meet_s: float) -> dict[str, str]:
    """HOROVOD_GLOO_TIMEOUT_SECONDS for the ranks' meeting: the stall timeout, which bounds the
    torch engines' meeting too (engine/rendezvous.py), never below Horovod's 30 s. Ranks that start
    slowly (torch read from a shared file system by many nodes, a loaded machine) otherwise abort
    in Gloo's store after 30 s ("Wait timeout after 30 seconds for key(s)"), seen in a fresh
    clone's SLURM 24.11 session. A value the user set (cluster.env) is kept."""
    if "HOROVOD_GLOO_TIMEOUT_SECONDS" in environ:
        return {}
    return {"HOROVOD_GLOO_TIMEOUT_SECONDS": str(math.ceil(max(HOROVOD_GLOO_DEFAULT_S, meet_s)))}


def finalize_mpi() -> None:
    """Finalize MPI if anything in this process started it (Horovod, or mpi4py imported by a user's
    script): a rank leaves with os._exit, which skips their atexit hooks, and OpenMPI's mpirun calls a
    process that exits without MPI_Finalize an abnormal termination (exit status 1)."""
    hvd = sys.modules.get("horovod.torch")
    if hvd is not None and hvd.is_initialized():
        hvd.shutdown()  # finalizes MPI when Horovod was the one that initialised it
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        mpi.Finalize()
