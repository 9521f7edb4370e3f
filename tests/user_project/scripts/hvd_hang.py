"""A Horovod script whose rank 1 hangs (asleep, no output, no CPU) while rank 0 waits for it in
hvd.allreduce. Horovod's background thread keeps polling in both ranks: the script watchdog must
still find rank 1 idle within its timeout, and name rank 1 alone (rank 0 waits in a collective).
Rank 1 writes when it went to sleep into HANG_MARK, so the test can tell how long detection took."""

import os
import time

import horovod.torch as hvd
import torch

hvd.init()
print("started", flush=True)
if hvd.rank() == 1:
    with open(os.environ["HANG_MARK"], "w") as f:
        f.write(str(time.time()))
    time.sleep(100000)  # hung here
hvd.allreduce(torch.ones(1), name="never_joined")
