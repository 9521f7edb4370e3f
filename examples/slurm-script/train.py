"""A plain torch.distributed (DDP) training script, instrumented with hpctrain.api.

    hpctrain run script=train.py cluster.ranks=2     # under hpctrain: records, summary, requeue
    torchrun --nproc-per-node 2 train.py             # or without it
    python train.py                                  # or one process

Outside hpctrain every `api` call is a no-op, and the process group is one process's when no
launcher started the script.
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from hpctrain import api

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=None, help="default: hpctrain's train.steps, else 100")
parser.add_argument("--lr", type=float, default=0.05)
args = parser.parse_args()
steps = args.steps or api.steps() or 100

if "RANK" not in os.environ:  # plain `python train.py`: a world of one
    os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="29511")
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()

torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)))
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
per_rank = api.batch_per_rank() or 32
g = torch.Generator().manual_seed(1)
X = torch.randn(8192, 32, generator=g)
Y = (X[:, :4].argmax(1)).long()  # a rule the model can learn

state = api.load_checkpoint()  # None on a fresh start; the saved state after a requeue
start = 0
if state is not None:
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    start = state["step"]
api.start_timer()
for step in range(start, steps):
    lo = (step * world + rank) * per_rank % (len(X) - per_rank)
    optimizer.zero_grad()
    loss = F.cross_entropy(model(X[lo : lo + per_rank]), Y[lo : lo + per_rank])
    loss.backward()
    optimizer.step()
    api.step(samples=per_rank, loss=loss.item())  # this rank's step: hpctrain's records
    if api.should_stop():  # every rank, every step: SLURM's time limit is near
        api.save_checkpoint(
            {"step": step + 1, "model": model.state_dict(), "optimizer": optimizer.state_dict()}
        )
        break  # hpctrain requeues the job; it resumes at load_checkpoint above
if rank == 0:
    print(f"rank 0: loss {loss.item():.4f} after {step + 1} steps", flush=True)
dist.destroy_process_group()
