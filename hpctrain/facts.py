"""What this host can do, gathered in one place and passed explicitly to pure planning code."""

from __future__ import annotations

import functools
import glob
import hashlib
import importlib.util
import json
import os
import shutil
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpctrain import bounded

TORCH_FACTS = ("cuda_available", "cuda_bf16", "cpu_fp16_autocast", "cpu_bf16_autocast")
TORCH_COUNTS = ("cuda_devices", "cuda_memory_bytes")


@dataclass(frozen=True)
class HostFacts:
    cpu_count: int
    is_root: bool
    hostname: str
    cuda_available: bool
    cuda_bf16: bool
    cuda_devices: int
    mpirun_found: bool  # an `mpirun` on PATH (local ranks start with it, or with spawn)
    cpu_fp16_autocast: bool
    cpu_bf16_autocast: bool
    cuda_memory_bytes: int = 0  # the smallest visible GPU's memory (0: none)

    @classmethod
    def gather(cls) -> HostFacts:
        t = torch_facts()
        return cls(
            cpu_count=len(os.sched_getaffinity(0))
            if hasattr(os, "sched_getaffinity")
            else (os.cpu_count() or 1),
            is_root=os.geteuid() == 0,
            hostname=socket.gethostname(),
            cuda_devices=int(t["cuda_devices"]),
            cuda_memory_bytes=int(t["cuda_memory_bytes"]),
            mpirun_found=shutil.which("mpirun") is not None,
            **{k: bool(t[k]) for k in TORCH_FACTS},
        )

    def on_gpus(self, device: str) -> bool:
        """Ranks on this host compute on its GPUs for train.device=`device` (cuda, or auto where
        torch sees one)."""
        return device == "cuda" or (device == "auto" and self.cuda_available)

    @classmethod
    def example(cls, **changes: object) -> HostFacts:
        """A fixed 2-core CPU host, for tests and snapshots."""
        base = dict(
            cpu_count=2,
            is_root=False,
            hostname="host0",
            cuda_available=False,
            cuda_bf16=False,
            cuda_devices=0,
            mpirun_found=True,
            cpu_fp16_autocast=True,
            cpu_bf16_autocast=True,
        )
        base.update(changes)
        return cls(**base)  # type: ignore[arg-type]


def probe_torch() -> dict[str, bool | int]:
    """What torch says of this host's devices and of its own build (imports torch: 1.5-2.5 s)."""
    import torch

    cuda = torch.cuda.is_available()
    return {
        "cuda_available": cuda,
        "cuda_bf16": bool(cuda and torch.cuda.is_bf16_supported()),
        "cuda_devices": torch.cuda.device_count() if cuda else 0,
        # the least of the devices' memory: what a rank on any of them has
        "cuda_memory_bytes": min(
            (torch.cuda.get_device_properties(i).total_memory for i in range(torch.cuda.device_count())),
            default=0,
        )
        if cuda
        else 0,
        "cpu_fp16_autocast": autocast_supported("fp16", "cpu"),
        "cpu_bf16_autocast": autocast_supported("bf16", "cpu"),
    }


def torch_facts_key() -> str:
    """What the torch facts depend on, found without importing torch: the interpreter, the torch
    installation (its path and modification time), the GPU device files and the devices visible
    to this process. Any change of these makes a new key, so a cached answer is never stale."""
    spec = importlib.util.find_spec("torch")
    origin = spec.origin if spec is not None and spec.origin else ""
    try:
        stamp = os.stat(origin).st_mtime_ns if origin else 0
    except OSError:
        stamp = 0
    devices = sorted(glob.glob("/dev/nvidia*") + glob.glob("/dev/kfd") + glob.glob("/dev/dri/renderD*"))
    visible = [os.environ.get(v, "") for v in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")]
    text = json.dumps([sys.executable, origin, stamp, devices, visible, socket.gethostname()])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def installation_stamp(root: Path) -> int:
    """The newest modification time of the Python modules under `root` (0: none readable): a new
    version, a pulled commit or an edit changes it."""
    newest = 0
    for folder, _dirs, files in os.walk(root):
        for name in files:
            if name.endswith(".py"):
                try:
                    newest = max(newest, os.stat(os.path.join(folder, name)).st_mtime_ns)
                except OSError:
                    pass  # removed while walking
    return newest


@functools.cache
def hpctrain_key() -> str:
    """hpctrain's installation, for what is cached of its own ranks (their fixed memory depends on
    what they import): its path and installation_stamp, about 4 ms for its 230 modules."""
    root = Path(__file__).resolve().parent
    return f"{root}@{installation_stamp(root)}"


@functools.cache
def importable(module: str) -> bool:
    """Whether `module` can be imported here, asked without importing it (Horovod's import takes
    seconds): what the default engine and the engine's rules decide on. Asked once per process:
    every config built asks it for its default engine (a 256-point sweep: 256 path searches)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def host_memory_bytes(meminfo: Path = Path("/proc/meminfo")) -> int:
    """This machine's memory (MemTotal); 0 where the kernel does not say."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        pass
    return 0


def cache_dir() -> Path:
    """hpctrain's cache (as scripts/setup.sh keeps its wheels): $HPCTRAIN_CACHE, else
    $XDG_CACHE_HOME/hpctrain, else ~/.cache/hpctrain."""
    if os.environ.get("HPCTRAIN_CACHE"):
        return Path(os.environ["HPCTRAIN_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "hpctrain"


def torch_facts() -> dict[str, bool | int]:
    """probe_torch(), probed once per key (torch_facts_key) and then read from the cache: every
    dry run and local launch would otherwise import torch only to ask it. An unreadable cache is
    probed again; one that cannot be written is not kept."""
    path = cache_dir() / f"host-facts-{torch_facts_key()}.json"
    found = read_cached(path)
    if (
        isinstance(found, dict)
        and all(isinstance(found.get(k), bool) for k in TORCH_FACTS)
        and all(type(found.get(k)) is int for k in TORCH_COUNTS)
    ):
        return {k: found[k] for k in TORCH_FACTS + TORCH_COUNTS}
    facts = probe_torch()
    keep_cached(path, facts)
    return facts


def read_cached(path: Path) -> Any:
    """A cached JSON document; None when absent or unreadable (the caller computes it again and
    checks the shape of what it got)."""
    try:
        return json.loads(bounded.read_bytes(path, bounded.SMALL))  # a planted giant is no entry
    except (OSError, ValueError, RecursionError):
        return None


def keep_cached(path: Path, doc: object) -> None:
    """Write a JSON document to the cache, whole or not at all (a concurrent reader never sees
    half a file); a cache that cannot be written is not kept."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(doc))
        tmp.replace(path)
    except OSError:
        pass


def mpi_library_version() -> str:
    """The MPI library's own version line (mpi4py returns it NUL-terminated)."""
    from mpi4py import MPI

    return MPI.Get_library_version().replace("\x00", "").strip().splitlines()[0]


def ephemeral_ports(path: str = "/proc/sys/net/ipv4/ip_local_port_range") -> tuple[int, int]:
    """The range the kernel hands out for outgoing connections (Linux's default 32768-60999)."""
    try:
        with open(path) as f:
            low, high = (int(x) for x in f.read().split()[:2])
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def free_tcp_port(tries: int = 50) -> int:
    """A TCP port free on this host now, for a server the ranks start later (torch.distributed's
    store). Below the ephemeral range: a port the kernel chose (bind to 0) is one it may hand to
    any outgoing connection between this check and the store's bind, which happened in the test
    suite (EADDRINUSE); below the range only another explicit bind can take it. The kernel's
    choice when no port there is free."""
    import random
    import socket

    low, _ = ephemeral_ports()
    start = 10000 if low > 11000 else 1024
    for port in random.sample(range(start, max(low, start + 1)), min(tries, max(low - start, 1))):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wants_cuda(choice: str) -> bool:
    """train.device: cuda, or auto on a machine where torch sees a GPU."""
    import torch

    return choice == "cuda" or (choice == "auto" and torch.cuda.is_available())


def autocast_supported(precision: str, device_type: str) -> bool:
    """Whether this torch build can autocast to `precision` on `device_type` (probed, not assumed)."""
    import torch

    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(precision)
    if dtype is None:
        return True
    try:
        with torch.autocast(device_type=device_type, dtype=dtype):
            a = torch.ones(2, 2, device=device_type)
            return (a @ a).dtype == dtype
    except (RuntimeError, AssertionError):
        return False
