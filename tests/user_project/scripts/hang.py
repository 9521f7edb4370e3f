"""Rank 1 hangs (sleeps without output or CPU use) waiting for a multiprocessing pool whose forked
workers hang too; rank 0 finishes. The script watchdog must end the run naming rank 1, with its
stack, and the pool's workers (re-parented when rank 1 is killed) must not outlive the run."""

import multiprocessing
import os
import time

print("started", flush=True)
if os.environ.get("RANK") == "1":
    with multiprocessing.get_context("fork").Pool(2) as pool:
        pool.map(time.sleep, [100000, 100000])  # hung here
