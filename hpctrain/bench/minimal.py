"""Minimal hand-written training scripts: the baselines of `hpctrain bench overhead`.

    --engine horovod   written the way Horovod's PyTorch examples are (hvd.DistributedOptimizer)
    --engine ddp       the way torch's DDP tutorial is (init_process_group, DistributedDataParallel)
    --engine fsdp      the way FSDP2's tutorial is (fully_shard on each block, then the root)
    --engine none      the same per-rank work with no communication at all: N of these started
                       together are the ceiling no data-parallel engine can beat on this machine
    --device cuda      each process on its local rank's GPU, as the examples pin it, NCCL for DDP
                       (Horovod reduces GPU tensors with its own NCCL operations); the loop waits for
                       the device at each step's end, as a script that logs its loss does
Started by mpirun (OMPI_COMM_WORLD_*) or as torchrun starts processes (RANK, WORLD_SIZE, LOCAL_RANK).

The sources' CNN (or --model mlp: hpctrain's MLP, 2 hidden layers of 2048, comm-bound), synthetic data, a DistributedSampler (none: the same slices, alone). Timed like
hpctrain: wall time of the steps after warm-up, from the end of one step to the end of the next.
Every process prints one JSON line with its rank and timed seconds; the caller takes the slowest.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


class Net(nn.Module):
    def __init__(self, channels: int = 3, size: int = 32, width: int = 16, classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(channels, width, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.head = nn.Linear(2 * width * (size // 4) ** 2, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(self.features(x), 1))


def mlp(width: int = 2048, depth: int = 2, fan_in: int = 3 * 32 * 32, classes: int = 10) -> nn.Module:
    """hpctrain's MLP (train/models.py): a block (Linear, ReLU) per hidden layer, then the head."""
    layers: list[nn.Module] = [nn.Flatten()]
    for _ in range(depth):
        layers.append(nn.Sequential(nn.Linear(fan_in, width), nn.ReLU()))
        fan_in = width
    return nn.Sequential(*layers, nn.Linear(fan_in, classes))


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine", choices=("horovod", "ddp", "fsdp", "none"), default="horovod")
    ap.add_argument("--model", choices=("cnn", "mlp", "tiny"), default="cnn")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--samples", type=int, default=4096)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    return ap.parse_args()


def main() -> None:
    args = _args()
    env = os.environ
    rank = int(env.get("OMPI_COMM_WORLD_RANK", env.get("RANK", "0")))
    size = int(env.get("OMPI_COMM_WORLD_SIZE", env.get("WORLD_SIZE", "1")))
    local = int(env.get("OMPI_COMM_WORLD_LOCAL_RANK", env.get("LOCAL_RANK", "0")))
    device = torch.device("cpu")
    if args.device == "cuda":
        torch.cuda.set_device(local)  # one GPU per local rank, before any collective
        device = torch.device("cuda", local)

    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    data = TensorDataset(
        torch.randn(args.samples, 3, 32, 32, generator=gen),
        torch.randint(0, 10, (args.samples,), generator=gen),
    )
    sampler: DistributedSampler[tuple[torch.Tensor, ...]] = DistributedSampler(
        data, num_replicas=size, rank=rank, seed=0
    )
    loader = DataLoader(data, batch_size=args.batch, sampler=sampler, drop_last=True)
    built = {"cnn": Net, "mlp": mlp, "tiny": lambda: mlp(width=16, depth=1)}
    model: nn.Module = built[args.model]().to(device)
    if args.engine == "fsdp":  # sharded before the optimizer takes the parameters
        import torch.distributed as dist
        from torch.distributed.fsdp import fully_shard

        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=rank, world_size=size)
        for block in model.children():
            if isinstance(block, nn.Sequential):
                fully_shard(block)
        fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    if args.engine == "horovod":
        import horovod.torch as hvd

        hvd.init()
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(opt, root_rank=0)
    elif args.engine == "ddp":
        import torch.distributed as dist

        # MASTER_ADDR/PORT from mpirun -x, or the spawner
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=rank, world_size=size)
        model = nn.parallel.DistributedDataParallel(
            model, device_ids=[local] if device.type == "cuda" else None
        )
    loss_fn = nn.CrossEntropyLoss()

    step, timed, epoch = 0, 0.0, 0
    t_prev = time.perf_counter()
    while step < args.steps:
        sampler.set_epoch(epoch)
        for x, y in loader:
            if step >= args.steps:
                break
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            if device.type == "cuda":
                torch.cuda.synchronize()
            t = time.perf_counter()
            if step >= args.warmup:
                timed += t - t_prev
            t_prev = t
            step += 1
        epoch += 1
    print(json.dumps({"rank": rank, "size": size, "timed_s": timed}), flush=True)
    if args.engine in ("ddp", "fsdp"):
        dist.barrier()
        dist.destroy_process_group()
    elif args.engine == "horovod":
        hvd.shutdown()  # MPI_Finalize: mpirun calls a process that leaves without it a failure
    # no interpreter teardown: torch's Gloo process-group destructor, run from DDP's reducer as
    # the model is freed, can deadlock with its worker thread over the GIL (it hung a suite run for 10 minutes)
    sys.stdout.flush()
    os._exit(0)


def throughput(output: str, batch: int, steps: int, warmup: int) -> float:
    """Global samples/s from every process's JSON record: the slowest process sets the pace. The
    processes write to one pipe at once, so records are found anywhere, not only at line starts."""
    found = [json.loads(m) for m in re.findall(r"\{[^{}]*\}", output)]
    size = found[0]["size"]
    if len(found) != size:
        raise ValueError(f"{len(found)} of {size} processes reported")
    return batch * size * (steps - warmup) / max(f["timed_s"] for f in found)


if __name__ == "__main__":
    main()
