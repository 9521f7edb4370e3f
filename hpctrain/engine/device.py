"""Which device this rank computes on, bound before any collective.

torch's NCCL collectives (and the object collectives over them) run on the *current* CUDA device:
a rank that starts a process group, a device mesh or Horovod before it binds its GPU puts every
rank of a node on cuda:0. So the rank entry binds first (rank.py), from the launcher's local rank,
and everything after it (engines, meshes, the allreduce workload, the trainer) reads the binding.

One GPU per local rank, as torchrun and Horovod's examples pin it: LOCAL_RANK -> cuda:LOCAL_RANK.
Where the scheduler gave each task its own GPU (CUDA_VISIBLE_DEVICES of one device, SLURM's
--gpus-per-task), the rank sees one device and binds cuda:0.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import timedelta

import torch

from hpctrain.engine.world import launcher_local_rank
from hpctrain.facts import wants_cuda


def device_index(local_rank: int, visible: int) -> int:
    """The CUDA device a local rank binds among the `visible` ones: its own, or (the scheduler
    gave it one device) that one. More local ranks than devices is refused at plan time (NCCL
    refuses two ranks on one GPU); past that check, ranks would take the devices in turn."""
    if visible < 1:
        raise ValueError("no CUDA device is visible to bind")
    return local_rank % visible


def bind_device(choice: str, environ: Mapping[str, str]) -> torch.device:
    """Bind this process's device for train.device=`choice` (cpu | cuda | auto) and return it."""
    if not wants_cuda(choice):
        return torch.device("cpu")
    index = device_index(launcher_local_rank(environ), torch.cuda.device_count())
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def current_device(choice: str) -> torch.device:
    """The device bind_device chose for this process (it must have run)."""
    if not wants_cuda(choice):
        return torch.device("cpu")
    return torch.device("cuda", torch.cuda.current_device())


def init_process_group(
    device: torch.device, rendezvous_s: float = 0.0, timeout: timedelta = timedelta(minutes=30)
) -> None:
    """torch.distributed's default group for this rank's device: NCCL with its communicator
    created at once on the bound GPU (device_id), else Gloo. The launcher's variables are already
    exported (engine/world.py). `rendezvous_s` > 0: the ranks meet within that long or the rank
    fails saying who did not come (engine/rendezvous.py); 0: torch's own meeting."""
    import torch.distributed as dist

    nccl = device.type == "cuda"
    if rendezvous_s > 0:
        from hpctrain.engine.rendezvous import meet

        store = meet(rendezvous_s)
        world = {"store": store, "rank": int(os.environ["RANK"]), "world_size": int(os.environ["WORLD_SIZE"])}
    else:
        world = {}
    if nccl:
        dist.init_process_group("nccl", timeout=timeout, device_id=device, **world)
    else:
        dist.init_process_group("gloo", timeout=timeout, **world)


def ensure_process_group(device: torch.device, rendezvous_s: float = 0.0) -> None:
    """torch.distributed's default group, made now where the engine made none (Horovod has none;
    a pipeline's transfers, a mesh's groups and context parallelism's exchanges go over it
    whatever the engine); the ranks meet within `rendezvous_s` (engine/rendezvous.py)."""
    import torch.distributed as dist

    from hpctrain.engine.world import export_torch_env

    if not dist.is_initialized():
        export_torch_env()
        init_process_group(device, rendezvous_s)
