"""Rank 1 hangs (sleeps without output or CPU use); rank 0 finishes. The script watchdog must end
the run naming rank 1, with its stack."""

import os
import time

print("started", flush=True)
if os.environ.get("RANK") == "1":
    time.sleep(100000)  # hung here
