"""Horovod initialisation over MPI or Gloo, and the rank identity the rest of the code uses.

With backend=mpi, Horovod learns rank and size from MPI. With backend=gloo, mpirun only starts
the processes; each rank derives Horovod's HOROVOD_RANK/SIZE/... variables from the launcher's
(OpenMPI's OMPI_COMM_WORLD_*), as horovodrun's gloo_run sets them (create_slot_env_vars), and
meets the others at the launcher's rendezvous server.
"""
from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Mapping

# Horovod's Gloo variables <- OpenMPI's per-process variables.
GLOO_FROM_OMPI = {
    "HOROVOD_RANK": "OMPI_COMM_WORLD_RANK",
    "HOROVOD_SIZE": "OMPI_COMM_WORLD_SIZE",
    "HOROVOD_LOCAL_RANK": "OMPI_COMM_WORLD_LOCAL_RANK",
    "HOROVOD_LOCAL_SIZE": "OMPI_COMM_WORLD_LOCAL_SIZE",
}


class CommError(RuntimeError):
    """Horovod's view of the world does not match what the launcher promised."""


def gloo_env(environ: Mapping[str, str]) -> dict[str, str]:
    """Horovod Gloo identity variables for this process, from its launcher's variables."""
    missing = [v for v in GLOO_FROM_OMPI.values() if v not in environ]
    if missing:
        raise CommError(f"backend=gloo needs a launcher that sets {', '.join(missing)} (OpenMPI's mpirun)")
    out = {hv: environ[ov] for hv, ov in GLOO_FROM_OMPI.items()}
    size, local_size = int(out["HOROVOD_SIZE"]), int(out["HOROVOD_LOCAL_SIZE"])
    # mpirun --map-by slot places consecutive ranks on one host, so hosts are rank // local_size.
    out["HOROVOD_CROSS_RANK"] = str(int(out["HOROVOD_RANK"]) // local_size)
    out["HOROVOD_CROSS_SIZE"] = str(size // local_size)
    out.setdefault("HOROVOD_HOSTNAME", environ.get("HPCTRAIN_GLOO_HOSTNAME", socket.gethostname()))
    return out


@dataclass(frozen=True)
class RankInfo:
    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int
    hostname: str


def init_horovod(backend: str, expected_size: int | None = None):  # -> horovod.torch module
    """hvd.init() for the chosen backend; checks the world size the launcher promised."""
    if backend == "gloo":
        os.environ.update(gloo_env(os.environ))
    import horovod.torch as hvd

    hvd.init()
    if backend == "mpi" and not hvd.mpi_enabled():
        raise CommError("backend=mpi, but Horovod did not initialise MPI (was it built with MPI?)")
    if backend == "gloo" and not hvd.gloo_enabled():
        raise CommError("backend=gloo, but Horovod did not initialise Gloo (was it built with Gloo?)")
    if expected_size is not None and hvd.size() != expected_size:
        # The silent trap: every process believes it is rank 0 of 1 and trains alone.
        raise CommError(f"Horovod sees a world of {hvd.size()} rank(s) but the plan has {expected_size}; "
                        "the launcher and Horovod disagree (wrong MPI, or processes not started by mpirun/srun)")
    return hvd


def rank_info(hvd) -> RankInfo:
    return RankInfo(hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size(),
                    hvd.cross_rank(), hvd.cross_size(), socket.gethostname())
