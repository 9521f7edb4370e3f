"""A minimal hand-written Horovod training script: the baseline for `hpctrain bench overhead`.

Written the way Horovod's PyTorch examples are: the sources' CNN, synthetic data, a
DistributedSampler, hvd.DistributedOptimizer. Timed like hpctrain: wall time of the steps after
warm-up, from the end of one step to the end of the next. Prints one JSON line on rank 0.
"""

from __future__ import annotations

import argparse
import json
import time

import horovod.torch as hvd
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--samples", type=int, default=4096)
    args = ap.parse_args()

    hvd.init()
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    data = TensorDataset(
        torch.randn(args.samples, 3, 32, 32, generator=gen),
        torch.randint(0, 10, (args.samples,), generator=gen),
    )
    sampler: DistributedSampler[tuple[torch.Tensor, ...]] = DistributedSampler(
        data, num_replicas=hvd.size(), rank=hvd.rank(), seed=0
    )
    loader = DataLoader(data, batch_size=args.batch, sampler=sampler, drop_last=True)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    loss_fn = nn.CrossEntropyLoss()

    step, timed, epoch = 0, 0.0, 0
    t_prev = time.perf_counter()
    while step < args.steps:
        sampler.set_epoch(epoch)
        for x, y in loader:
            if step >= args.steps:
                break
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            t = time.perf_counter()
            if step >= args.warmup:
                timed += t - t_prev
            t_prev = t
            step += 1
        epoch += 1
    slowest = hvd.allreduce(torch.tensor(timed), op=hvd.Max).item()
    if hvd.rank() == 0:
        n = args.steps - args.warmup
        print(json.dumps({"throughput_samples_per_s": args.batch * hvd.size() * n / slowest}), flush=True)


if __name__ == "__main__":
    main()
