"""The process's own memory, which no trace of the model sees, measured once per host and cached.

On CPUs a rank's reported peak is its resident set (train/memory.py): the interpreter, torch, the
engine's libraries and threads and hpctrain itself, a few hundred MiB before any tensor. It is
measured as the peak of a real two-rank run of a model of a few thousand parameters with the
engine the point uses (the probe), so it counts what a rank really loads. On GPUs the allocator's
peak (what the run reports) leaves the CUDA context out, but the device's memory holds it: it is
measured as the memory a fresh process holds on the device after its first allocation, beyond
what the allocator reserved.

Each figure is kept under hpctrain's cache, by host, engine, torch, interpreter and hpctrain's own
installation (an upgrade changes what a rank imports), and by the malloc settings of the ranks'
environment, given in the config or inherited (glibc's thresholds, a preloaded allocator). The
newest KEPT figures are kept."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from hpctrain import records
from hpctrain.analysis.memory import Fixed
from hpctrain.config.schema import Config
from hpctrain.errors import LaunchError
from hpctrain.facts import cache_dir, hpctrain_key, keep_cached, read_cached, torch_facts_key
from hpctrain.lifeline import with_lifeline
from hpctrain.parallel.registry import kind_of

PROBE_TIMEOUT_S = 300
# figures kept, the newest: each hpctrain edit or upgrade is a new key, and the old ones never match again
KEPT = 32
CONTEXT_PROBE = (
    "import torch; torch.cuda.init(); torch.zeros(1, device='cuda'); f, t = torch.cuda.mem_get_info(); "
    "print(t - f - torch.cuda.memory_reserved())"
)


def probe_overrides(cfg: Config) -> list[str]:
    """What the probe takes of the point: its engine, its parallelism's probe (which libraries and
    process groups a rank loads) and its malloc settings."""
    malloc = [f"+cluster.env.{k}={v}" for k, v in sorted(cfg.cluster.env.items()) if k.startswith("MALLOC_")]
    return [*kind_of(cfg).memory_probe(cfg), f"parallelism.engine={cfg.parallelism.engine}", *malloc]


def probe_argv(cfg: Config, run_dir: Path, python: str = sys.executable) -> list[str]:
    """A two-rank run of an MLP of 8 hidden units in two blocks, shaped like the point."""
    return [
        python,
        "-m",
        "hpctrain.cli",
        "run",
        "--no-progress",
        f"run.dir={run_dir}",
        "cluster=local",
        "cluster.ranks=2",
        "model=mlp",
        "model.width=8",
        "model.depth=2",
        "data.num_samples=64",
        "train.batch_per_rank=8",
        "train.steps=3",
        "train.warmup_steps=1",
        "train.save_model=false",
        *probe_overrides(cfg),
    ]


def _key(cfg: Config, gpus: bool) -> str:
    what = ["cuda"] if gpus else ["cpu", *probe_overrides(cfg), *_inherited_malloc()]
    return json.dumps([socket.gethostname(), torch_facts_key(), hpctrain_key(), *what])


def _inherited_malloc() -> list[str]:
    """What a rank inherits of this environment that changes its resident memory: glibc's malloc
    settings and a preloaded allocator (tcmalloc, jemalloc)."""
    return [f"{k}={v}" for k, v in sorted(os.environ.items()) if k.startswith("MALLOC_") or k == "LD_PRELOAD"]


def fixed_cost(cfg: Config, gpus: bool) -> Fixed:
    """The point's fixed cost per rank, from the cache or measured now (seconds: a probe run)."""
    path = cache_dir() / "memory-fixed.json"
    found = read_cached(path)
    table = found if isinstance(found, dict) else {}
    key = _key(cfg, gpus)
    hit = table.get(key)
    if isinstance(hit, int) and hit >= 0:
        return Fixed(hit, "measured on this host earlier (cached)")
    n = _context_bytes() if gpus else _probe_peak(cfg)
    table[key] = n
    keep_cached(path, dict(list(table.items())[-KEPT:]))  # in the order they were measured
    return Fixed(n, "measured now")


def _probe_peak(cfg: Config) -> int:
    with tempfile.TemporaryDirectory(prefix="hpctrain-memory-") as tmp:
        run_dir = Path(tmp) / "probe"
        argv = probe_argv(cfg, run_dir)
        r = subprocess.run(with_lifeline(argv), capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
        if r.returncode != 0:
            raise LaunchError(
                f"the probe that measures a rank's own memory failed ({r.returncode}): {' '.join(argv)}\n"
                f"{r.stderr[-1500:]}"
            )
        s = records.read(run_dir / records.SUMMARY, records.RunSummary)
        return max(s.peak_memory_bytes)


def _context_bytes() -> int:
    r = subprocess.run([sys.executable, "-c", CONTEXT_PROBE], capture_output=True, text=True, timeout=120)
    try:
        return max(int(r.stdout.strip().splitlines()[-1]), 0)
    except (ValueError, IndexError):
        raise LaunchError(f"the probe of the CUDA context's memory failed: {r.stderr[-800:]}") from None
