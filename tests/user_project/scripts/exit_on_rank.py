"""Exits with status 3 on the rank given as its argument (after printing a line); or kills
itself with SIGKILL when the second argument is "kill"."""

import os
import signal
import sys

rank = int(os.environ["RANK"])
print(f"rank {rank} starting", flush=True)
if rank == int(sys.argv[1]):
    if len(sys.argv) > 2 and sys.argv[2] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    sys.exit(3)
