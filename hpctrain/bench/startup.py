"""`hpctrain bench startup`: what a rank pays before its first step, with torch's optimizers and
with the built-in trainer's (hpctrain.train.optim: the same updates without the torch.compile
wrappers that import torch._dynamo), each with Python's cyclic collector on throughout and held
off until the model and optimizer are built, as a rank holds it (hpctrain/heap.py). Each
contender is a fresh process that imports torch, builds a small CNN, takes one SGD step and
exits; they run interleaved, in rotated order, so noise hits all alike; ratios are of medians
taken in this one run."""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import time

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

STEP = """
import sys
from hpctrain import heap
{hold}
import torch
from torch import nn
model = nn.Sequential(nn.Conv2d(1, 16, 3), nn.ReLU(), nn.Flatten(), nn.Linear(16 * 6 * 6, 10))
opt = {cls}(model.parameters(), lr=0.05, momentum=0.9)
heap.release()
nn.functional.cross_entropy(model(torch.randn(8, 1, 8, 8)), torch.zeros(8, dtype=torch.long)).backward()
opt.step()
print("torch._dynamo" in sys.modules)
"""
TORCH_SGD, OWN_SGD = "torch.optim.SGD", "__import__('hpctrain.train.optim').train.optim.SGD"
# name: (optimizer, collector held during the start)
CONTENDERS = {
    "torch.optim.SGD": (TORCH_SGD, False),
    "torch.optim.SGD, collector held": (TORCH_SGD, True),
    "hpctrain optim.SGD": (OWN_SGD, False),
    "hpctrain optim.SGD, collector held": (OWN_SGD, True),
}


def _one(cls: str, held: bool) -> tuple[float, float, str]:
    """Wall and CPU seconds (user + system) of one fresh process; what it says of torch._dynamo."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    r = subprocess.run(
        [sys.executable, "-c", STEP.format(cls=cls, hold="heap.hold()" if held else "")],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, r.stdout.strip()


def run_startup(args: argparse.Namespace, console: Console) -> int:
    names = list(CONTENDERS)
    walls: dict[str, list[float]] = {n: [] for n in names}
    cpus: dict[str, list[float]] = {n: [] for n in names}
    dynamo: dict[str, str] = {}
    with Progress(console=console, transient=True, disable=not console.is_terminal) as bar:
        task = bar.add_task("fresh processes", total=args.repeats * len(names))
        for k in range(args.repeats):
            for n in names[k % len(names) :] + names[: k % len(names)]:
                wall, cpu, dynamo[n] = _one(*CONTENDERS[n])
                walls[n].append(wall)
                cpus[n].append(cpu)
                bar.advance(task)
    table = Table(title=f"one rank's start to its first step: median of {args.repeats}")
    for col in ("start", "wall s", "CPU s", "CPU vs torch's", "imports torch._dynamo"):
        table.add_column(col, justify="left" if col == "start" else "right")
    base = statistics.median(cpus[names[0]])
    for n in names:
        cpu = statistics.median(cpus[n])
        table.add_row(n, f"{statistics.median(walls[n]):.2f}", f"{cpu:.2f}", f"{cpu / base:.2f}", dynamo[n])
    console.print(table)
    return 0
