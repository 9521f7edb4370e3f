"""Horovod: hvd.DistributedOptimizer allreduces each gradient as soon as the backward pass has
produced it (fused into buffers of HOROVOD_FUSION_THRESHOLD bytes every HOROVOD_CYCLE_TIME).
Exposed communication is the time optimizer.synchronize() blocks after the backward pass.

With backend=mpi, Horovod learns rank and size from MPI. With backend=gloo, mpirun or srun only
start the processes; each rank takes Horovod's identity from the launcher's variables (as
horovodrun's gloo_run sets them) and meets the others at the launcher's rendezvous server.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import time
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpctrain.analysis.tune import Effect, Knob
from hpctrain.config.schema import Config, HorovodSettings
from hpctrain.engine.base import Engine, StageReplicas, Timeline, step_optimizer
from hpctrain.engine.quiet_wait import optimizer_handles, wait_quietly
from hpctrain.engine.world import CommError, RankInfo, gloo_env, gloo_timeout_env
from hpctrain.errors import Problem
from hpctrain.facts import importable

if TYPE_CHECKING:
    import torch
    from torch import nn

    from hpctrain.records import Layout

# the one command that builds and installs it for the active environment (commands/install.py)
INSTALL_HINT = (
    "install it with `hpctrain install horovod` (it builds for this environment in minutes; no root)"
)
HOROVOD_FUSION_BYTES = 64 * 2**20  # Horovod's HOROVOD_FUSION_THRESHOLD default


class HorovodEngine(Engine[HorovodSettings], StageReplicas, Timeline):
    settings = HorovodSettings
    collective = "hvd_s"
    grouping = "fusion"

    @classmethod
    def problems(cls, cfg: Config) -> list[Problem]:
        par = cfg.parallelism
        p = []
        if not horovod_installed():
            p.append(
                Problem(
                    "parallelism.engine",
                    "horovod is not installed in this environment (it is built from source: its last "
                    "release needs patches for PyTorch 2 and Python 3.12)",
                    f"{INSTALL_HINT}, or use parallelism.engine=ddp",
                )
            )
        if par.compression == "bf16":
            p.append(
                Problem(
                    "parallelism.compression",
                    "bf16 compression is a DDP communication hook; Horovod compresses to fp16 only",
                    "use parallelism.compression=fp16, or parallelism.engine=ddp",
                )
            )
        if par.cycle_time_ms is not None and par.cycle_time_ms <= 0:
            p.append(
                Problem(
                    "parallelism.cycle_time_ms",
                    f"must be > 0 (got {par.cycle_time_ms:g})",
                    "set it to a positive number of milliseconds, or null for Horovod's default",
                )
            )
        if par.fusion_threshold_mb is not None and par.fusion_threshold_mb < 0:
            p.append(
                Problem(
                    "parallelism.fusion_threshold_mb",
                    f"must be >= 0 (got {par.fusion_threshold_mb:g})",
                    "set parallelism.fusion_threshold_mb to 0 or more",
                )
            )
        return p

    @classmethod
    def rank_env(cls, cfg: Config) -> dict[str, str]:
        par = cfg.parallelism
        # the controller (coordination) and CPU tensor operations both follow the backend
        env = {"HOROVOD_CONTROLLER": str(par.backend), "HOROVOD_CPU_OPERATIONS": str(par.backend)}
        if par.fusion_threshold_mb is not None:
            env["HOROVOD_FUSION_THRESHOLD"] = str(int(par.fusion_threshold_mb * 1024 * 1024))
        if par.cycle_time_ms is not None:
            env["HOROVOD_CYCLE_TIME"] = f"{par.cycle_time_ms:g}"
        if cfg.profile.enabled and cfg.profile.horovod_timeline:
            env["HOROVOD_TIMELINE"] = "DYNAMIC"  # started and stopped around the profiler's window
        return env

    @classmethod
    def grad_bucket_bytes(cls, cfg: Config) -> int:
        mb = cfg.parallelism.fusion_threshold_mb
        return HOROVOD_FUSION_BYTES if mb is None else int(mb * 2**20)  # 0 disables fusion

    @classmethod
    def buffer_bytes(cls, cfg: Config, layout: Layout, grad_bytes: int) -> int:
        # the fusion buffer, allocated whole once there are replicas to average with
        return cls.grad_bucket_bytes(cfg) if layout.replicas > 1 else 0

    @classmethod
    def tune_knobs(cls, cfg: Config) -> list[Knob]:
        # the fusion buffer around Horovod's 64 MB default (0: no fusion, a message per tensor),
        # the cycle around its 1 ms (Horovod's docs: "Tensor Fusion" and its autotune's range)
        return [
            Knob("parallelism.fusion_threshold_mb", (0, 4, 16, 64, 128), Effect.grouping),
            Knob("parallelism.compression", ("none", "fp16"), Effect.wire),
            Knob("parallelism.cycle_time_ms", (0.5, 1, 5)),
        ]

    @classmethod
    def needs_mpi(cls, cfg: Config) -> bool:
        return cfg.parallelism.backend == "mpi"

    @classmethod
    def needs_gloo_rendezvous(cls, cfg: Config) -> bool:
        return cfg.parallelism.backend == "gloo"

    def init(self, layout: Layout) -> RankInfo:
        self.backend, expected_size = self.run.backend, layout.world_size
        # hybrid: one process set per pipeline stage, holding its replicas (registered at init)
        groups = [layout.replica_ranks(s) for s in range(layout.stages)] if layout.pipelined else []
        import horovod.torch as hvd

        from hpctrain.facts import wants_cuda

        if wants_cuda(self.run.device) and not hvd.nccl_built():
            raise CommError(horovod_without_nccl())
        sets = [hvd.ProcessSet(g) for g in groups]
        self.hvd = init_horovod(
            self.backend, expected_size=expected_size, process_sets=sets, meet_s=self.run.rendezvous_s
        )
        rank = self.hvd.rank()
        self.process_set = next((ps for ps, g in zip(sets, groups) if rank in g), None)
        return rank_info(self.hvd)

    def wrap_stage(
        self, pieces: list[nn.Module], optimizer: torch.optim.Optimizer, group: Any
    ) -> tuple[list[nn.Module], Any]:
        hvd = self.hvd
        named = [(f"{i}.{n}", p) for i, piece in enumerate(pieces) for n, p in piece.named_parameters()]
        wrapped = hvd.DistributedOptimizer(
            optimizer,
            named_parameters=named,
            compression=self._compression(),
            # every micro-batch's backward pass accumulates into the gradients; the last one sends
            backward_passes_per_step=self.run.microbatches,
            op=hvd.Average,
            process_set=self.process_set,
        )
        return pieces, wrapped

    def _compression(self) -> Any:
        hvd = self.hvd
        return hvd.Compression.fp16 if self.run.compression == "fp16" else hvd.Compression.none

    def wrap(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[nn.Module, Any]:
        hvd = self.hvd
        wrapped = hvd.DistributedOptimizer(
            optimizer,
            named_parameters=model.named_parameters(),
            compression=self._compression(),
            backward_passes_per_step=self.run.accumulate,
            op=hvd.Average,
        )
        return model, wrapped

    def broadcast_initial(self, model: nn.Module) -> None:
        # Rank 0's weights only. A fresh optimizer holds no state, and every rank built the same
        # one from the same config: there is nothing of it to send. hvd.broadcast_optimizer_state
        # would create the state by stepping once on zero gradients (horovod/torch/functions.py),
        # which applies AdamW's (and SGD's) weight decay and starts Adam's step count at 1: every
        # later bias correction is then off, and N ranks no longer train what one rank trains.
        self.hvd.broadcast_parameters(model.state_dict(), root_rank=0)

    def micro_batch(self, model: nn.Module, last: bool) -> AbstractContextManager[Any]:
        # backward_passes_per_step: Horovod counts the passes and allreduces after the last
        return contextlib.nullcontext()

    def vote(self, flag: bool, step: int) -> Any:
        import torch

        # a one-element allreduce that Horovod fuses with the gradients
        return self.hvd.allreduce_async(
            torch.tensor([float(flag)]), op=self.hvd.Max, name=f"hpctrain.stop.{step}"
        )

    def vote_result(self, handle: Any) -> bool:
        return float(self._synchronize(handle)[0]) > 0

    def _synchronize(self, handle: Any) -> Any:
        wait_quietly([handle], self.hvd.poll)  # not Horovod's spin (engine/quiet_wait.py)
        return self.hvd.synchronize(handle)

    def wait_gradients(self, optimizer: Any) -> None:
        # blocks the host until every gradient allreduce has finished (on GPUs, NCCL's stream
        # included): the step's next mark is recorded only then
        wait_quietly(optimizer_handles(optimizer), self.hvd.poll)
        optimizer.synchronize()

    def optimizer_step(self, optimizer: Any, scaler: torch.amp.GradScaler | None) -> None:
        with optimizer.skip_synchronize():
            step_optimizer(optimizer, scaler)

    def barrier(self, name: str) -> None:
        import torch

        self._synchronize(self.hvd.allreduce_async(torch.zeros(1), name=name))

    def allreduce_now(self, t: torch.Tensor, name: str) -> None:
        self._synchronize(self.hvd.allreduce_async_(t, op=self.hvd.Sum, name=name))  # in place, as DDP's

    def allgather_object(self, obj: Any) -> list[Any]:
        return list(self.hvd.allgather_object(obj))

    def environment(self) -> dict[str, Any]:
        import horovod

        hvd = self.hvd
        rec: dict[str, Any] = {
            "engine": self.name,
            "horovod": horovod.__version__,
            "backend": self.backend,
            "horovod_build": {
                name: bool(getattr(hvd, f"{name}_built")())
                for name in ("mpi", "gloo", "nccl", "cuda", "rocm", "ddl", "ccl")
            },
            # what Horovod runs on, as it reports it (the build may have both controllers)
            "horovod_runtime": {
                "mpi_enabled": bool(hvd.mpi_enabled()),
                "gloo_enabled": bool(hvd.gloo_enabled()),
            },
        }
        if self.backend == "mpi":
            from hpctrain.facts import mpi_library_version

            rec["mpi_library"] = mpi_library_version()
            rec["mpi4py"] = __import__("mpi4py").__version__
        return rec

    def shutdown(self) -> None:
        self.hvd.shutdown()

    def start_timeline(self, path: Path) -> None:
        self.hvd.start_timeline(str(path))  # rank 0 (the coordinator) writes it

    def stop_timeline(self) -> None:
        self.hvd.stop_timeline()


def init_horovod(  # -> horovod.torch module
    backend: str,
    expected_size: int | None = None,
    process_sets: list[Any] | None = None,
    meet_s: float = 0.0,
):
    """hvd.init() for the chosen backend; checks the world size the launcher promised.
    `process_sets`: hvd.ProcessSet objects to register (hybrid parallelism's stage replicas);
    `meet_s`: how long the ranks may take to meet over Gloo (train.stall_timeout_s)."""
    if backend == "gloo" and "HOROVOD_GLOO_RENDEZVOUS_ADDR" in os.environ:
        os.environ.update(gloo_env(os.environ))
        os.environ.update(gloo_timeout_env(os.environ, meet_s))
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


def horovod_installed() -> bool:
    """Whether Horovod can be imported here (without importing it: that starts nothing, but takes
    seconds)."""
    return importable("horovod")


def horovod_without_nccl() -> str:
    """The refusal for GPU tensors on a Horovod built without NCCL (it would not reduce them)."""
    return (
        "engine=horovod on CUDA needs Horovod built with NCCL (horovod.torch.nccl_built() is False "
        "here): rebuild it with `HOROVOD_GPU_OPERATIONS=NCCL bash scripts/setup.sh` on a GPU node, "
        "or use parallelism.engine=ddp"
    )


def rank_info(hvd: Any) -> RankInfo:
    return RankInfo(
        hvd.rank(),
        hvd.size(),
        hvd.local_rank(),
        hvd.local_size(),
        hvd.cross_rank(),
        hvd.cross_size(),
        socket.gethostname(),
    )


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
            ["scontrol", "show", "hostnames", env.get("SLURM_STEP_NODELIST") or env["SLURM_JOB_NODELIST"]],
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
