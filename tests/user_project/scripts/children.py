"""Leaves two children behind on every rank: a detached `sleep 3001` (its shell parent exits at
once, so it is re-parented) and an ordinary child `sleep 3002` that holds the rank's stdout open.
The run must end when the script does, and neither may outlive it."""

import subprocess

subprocess.Popen(["sh", "-c", "sleep 3001 >/dev/null 2>&1 &"]).wait()
subprocess.Popen(["sleep", "3002"])  # inherits stdout: mpirun's pipe stays open while it lives
print("children started", flush=True)
