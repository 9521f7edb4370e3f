"""A plain torch.distributed DDP script (env:// rendezvous, as under torchrun)."""

import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank, size = dist.get_rank(), dist.get_world_size()
print(f"rank {rank} of {size} local {os.environ['LOCAL_RANK']}", flush=True)
torch.manual_seed(0)
model = DDP(torch.nn.Linear(16, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(int(sys.argv[1]) if len(sys.argv) > 1 else 5):
    opt.zero_grad()
    model(torch.randn(8, 16)).sum().backward()
    opt.step()
dist.destroy_process_group()
