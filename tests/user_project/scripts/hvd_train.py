"""A plain Horovod PyTorch script, written like Horovod's own examples."""

import argparse
import time

import horovod.torch as hvd
import torch
import torch.nn.functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--batch-size", type=int, default=32)
args = parser.parse_args()

hvd.init()
torch.manual_seed(42)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size())
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)
print(f"rank {hvd.rank()} of {hvd.size()} (local {hvd.local_rank()})", flush=True)
data, target = torch.randn(args.batch_size, 32), torch.randint(0, 10, (args.batch_size,))
start = time.time()
for _ in range(args.steps):
    optimizer.zero_grad()
    loss = F.cross_entropy(model(data), target)
    loss.backward()
    optimizer.step()
elapsed = time.time() - start
if hvd.rank() == 0:
    print(f"Total img/sec on {hvd.size()} rank(s): {args.batch_size * args.steps * hvd.size() / elapsed:.1f}")
