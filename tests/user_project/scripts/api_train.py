"""A Horovod training script instrumented with hpctrain.api: step records, a cooperative stop
at SLURM's signal, a checkpoint, and a resume that continues bit-identically.

    python api_train.py [STEPS [HOLD_STEP]]

STEPS: default hpctrain's train.steps (a study sets it per point). HOLD_STEP: on a fresh start, wait after that step until a stop is requested (for the tests).
"""

import sys
import time

import horovod.torch as hvd
import torch
import torch.nn.functional as F
from mypkg.marker import LR, VERSION
from mypkg.nets import TwoLayer

from hpctrain import api

steps = int(sys.argv[1]) if len(sys.argv) > 1 else api.steps() or 20
hold = int(sys.argv[2]) if len(sys.argv) > 2 else -1
hvd.init()
torch.manual_seed(0)
model = TwoLayer(features=16, hidden=32, classes=4)
opt = hvd.DistributedOptimizer(
    torch.optim.SGD(model.parameters(), lr=LR), named_parameters=model.named_parameters()
)
state = api.load_checkpoint()
start = 0
if state:
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    start = state["step"]
else:
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
if hvd.rank() == 0:
    print(f"code version {VERSION}, starting at step {start}", flush=True)
per_rank = api.batch_per_rank() or 8
g = torch.Generator().manual_seed(1)
X, Y = torch.randn(4096, 16, generator=g), torch.randint(0, 4, (4096,), generator=g)
api.start_timer()
stopped = False
for step in range(start, steps):
    lo = (step * hvd.size() + hvd.rank()) * per_rank % 4000
    opt.zero_grad()
    loss = F.cross_entropy(model(X[lo : lo + per_rank]), Y[lo : lo + per_rank])
    loss.backward()
    opt.step()
    api.step(samples=per_rank, loss=loss.item())
    while step == hold and start == 0 and not api.should_stop():
        time.sleep(0.2)
    if api.should_stop():
        stopped = True
        api.save_checkpoint({"step": step + 1, "model": model.state_dict(), "optimizer": opt.state_dict()})
        break
run_dir = api.run_dir()
if hvd.rank() == 0 and run_dir is not None and not stopped:
    torch.save(model.state_dict(), run_dir / "weights.pt")
