"""Horovod initialisation over MPI or Gloo, and the rank identity the rest of the code uses.

With backend=mpi, Horovod learns rank and size from MPI. With backend=gloo, mpirun only starts
the processes; each rank derives Horovod's HOROVOD_RANK/SIZE/... variables from the launcher's
(OpenMPI's OMPI_COMM_WORLD_*), as horovodrun's gloo_run sets them (create_slot_env_vars), and
meets the others at the launcher's rendezvous server.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..config.schema import Config


def horovod_gloo(cfg: Config) -> bool:
    """Horovod may run over Gloo and needs the launcher's rendezvous: the built-in trainer with
    engine=horovod, or a user script (which may be a Horovod script) with backend=gloo."""
    return cfg.parallelism.backend == "gloo" and (
        bool(cfg.script.path) or cfg.parallelism.engine == "horovod"
    )


def torch_distributed(cfg: Config) -> bool:
    """torch.distributed may run and needs MASTER_ADDR/MASTER_PORT: engine=ddp, a user script, or
    a pipeline (its stages talk point to point over torch.distributed whatever the engine)."""
    return bool(cfg.script.path) or cfg.parallelism.engine == "ddp" or cfg.parallelism.name != "data"


# Horovod's Gloo variables <- OpenMPI's per-process variables.
GLOO_FROM_OMPI = {
    "HOROVOD_RANK": "OMPI_COMM_WORLD_RANK",
    "HOROVOD_SIZE": "OMPI_COMM_WORLD_SIZE",
    "HOROVOD_LOCAL_RANK": "OMPI_COMM_WORLD_LOCAL_RANK",
    "HOROVOD_LOCAL_SIZE": "OMPI_COMM_WORLD_LOCAL_SIZE",
}


class CommError(RuntimeError):
    """Horovod's view of the world does not match what the launcher promised."""


# ... or from SLURM's per-task variables (srun).
GLOO_FROM_SLURM = {
    "HOROVOD_RANK": "SLURM_PROCID",
    "HOROVOD_SIZE": "SLURM_NTASKS",
    "HOROVOD_LOCAL_RANK": "SLURM_LOCALID",
    "HOROVOD_LOCAL_SIZE": "SLURM_NTASKS_PER_NODE",
}


def gloo_env(environ: Mapping[str, str]) -> dict[str, str]:
    """Horovod Gloo identity variables for this process, from its launcher's variables."""
    table = GLOO_FROM_OMPI if "OMPI_COMM_WORLD_RANK" in environ else GLOO_FROM_SLURM
    missing = [v for v in table.values() if v not in environ]
    if missing:
        raise CommError(
            f"backend=gloo needs a launcher that sets {', '.join(missing)} "
            "(OpenMPI's mpirun, or srun with --ntasks-per-node)"
        )
    out = {hv: environ[ov] for hv, ov in table.items()}
    size, local_size = int(out["HOROVOD_SIZE"]), int(out["HOROVOD_LOCAL_SIZE"])
    # mpirun --map-by slot places consecutive ranks on one host, so hosts are rank // local_size.
    out["HOROVOD_CROSS_RANK"] = str(int(out["HOROVOD_RANK"]) // local_size)
    out["HOROVOD_CROSS_SIZE"] = str(size // local_size)
    host = environ.get("HPCTRAIN_GLOO_HOSTNAME") or environ.get("SLURMD_NODENAME") or socket.gethostname()
    out["HOROVOD_HOSTNAME"] = host
    return out


def _iface_for(address: str) -> str:
    """The network interface that holds `address` (Gloo binds to an interface by name)."""
    import psutil

    for name, addrs in psutil.net_if_addrs().items():
        if any(a.address == address for a in addrs):
            return name
    return "lo"


def slurm_gloo_setup(run_dir: Path, timeout_s: float = 120.0) -> None:
    """Gloo inside a SLURM job: rank 0 runs Horovod's rendezvous server and publishes its address
    in the run directory (shared by all nodes); every rank then points Horovod at it."""
    env = os.environ
    key = f"{env.get('SLURM_JOB_ID', '0')}-{env.get('SLURM_RESTART_COUNT', '0')}"
    spot = run_dir / f"rendezvous-{key}.json"
    me = gloo_env(env)
    if me["HOROVOD_RANK"] == "0":
        from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
        from horovod.runner.http.http_server import RendezvousServer

        nodes = subprocess.run(
            ["scontrol", "show", "hostnames", env["SLURM_JOB_NODELIST"]],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        per_node = int(me["HOROVOD_LOCAL_SIZE"])
        server = RendezvousServer(verbose=0)
        port = server.start()
        server.init(
            get_host_assignments(
                parse_hosts(",".join(f"{n}:{per_node}" for n in nodes)), int(me["HOROVOD_SIZE"])
            )
        )
        _SERVERS.append(server)  # lives as long as this process
        addr = socket.gethostbyname(me["HOROVOD_HOSTNAME"])
        tmp = spot.with_suffix(".tmp")
        tmp.write_text(json.dumps({"addr": addr, "port": port}))
        tmp.replace(spot)
    deadline = time.monotonic() + timeout_s
    while not spot.exists():
        if time.monotonic() > deadline:
            raise CommError(f"no Gloo rendezvous published by rank 0 in {spot} after {timeout_s:.0f} s")
        time.sleep(0.2)
    where = json.loads(spot.read_text())
    os.environ.update(me)
    os.environ.update(
        {
            "HOROVOD_GLOO_RENDEZVOUS_ADDR": where["addr"],
            "HOROVOD_GLOO_RENDEZVOUS_PORT": str(where["port"]),
            "HOROVOD_GLOO_IFACE": _iface_for(socket.gethostbyname(me["HOROVOD_HOSTNAME"])),
            "HOROVOD_CONTROLLER": "gloo",
            "HOROVOD_CPU_OPERATIONS": "gloo",
        }
    )


_SERVERS: list[object] = []


@dataclass(frozen=True)
class RankInfo:
    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int
    hostname: str


def init_horovod(  # -> horovod.torch module
    backend: str, expected_size: int | None = None, process_sets: list[Any] | None = None
):
    """hvd.init() for the chosen backend; checks the world size the launcher promised.
    `process_sets`: hvd.ProcessSet objects to register (hybrid parallelism's stage replicas)."""
    if backend == "gloo" and "HOROVOD_GLOO_RENDEZVOUS_ADDR" in os.environ:
        os.environ.update(gloo_env(os.environ))
    import horovod.torch as hvd

    hvd.init(process_sets=process_sets or None)
    if backend == "mpi" and not hvd.mpi_enabled():
        raise CommError("backend=mpi, but Horovod did not initialise MPI (was it built with MPI?)")
    if backend == "gloo" and not hvd.gloo_enabled():
        raise CommError("backend=gloo, but Horovod did not initialise Gloo (was it built with Gloo?)")
    if expected_size is not None and hvd.size() != expected_size:
        # The silent trap: every process believes it is rank 0 of 1 and trains alone.
        raise CommError(
            f"Horovod sees a world of {hvd.size()} rank(s) but the plan has {expected_size}; "
            "the launcher and Horovod disagree (wrong MPI, or processes not started by mpirun/srun)"
        )
    return hvd


def rank_info(hvd) -> RankInfo:
    return RankInfo(
        hvd.rank(),
        hvd.size(),
        hvd.local_rank(),
        hvd.local_size(),
        hvd.cross_rank(),
        hvd.cross_size(),
        socket.gethostname(),
    )
