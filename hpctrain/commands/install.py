"""`hpctrain install horovod`: build (once per user, torch and Python) and install Horovod into the
environment hpctrain runs in; no root. `--dry-run` says what it would build and stops."""

from __future__ import annotations

import argparse
import sys
import time

from rich.console import Console

from hpctrain.facts import cache_dir
from hpctrain.install import horovod as hv


def cmd_install(args: argparse.Namespace, console: Console) -> int:
    python = sys.executable
    found = hv.look(python)
    console.print(
        f"environment: {python} ({found.python}), torch {found.torch or 'missing'}"
        f"{f' (CUDA {found.torch_cuda})' if found.torch_cuda else ''}; "
        f"C++ {found.cxx or 'missing'}, cmake {found.cmake or 'missing'}, MPI {found.mpicxx or 'none'}, "
        f"nvcc {found.nvcc or 'none'}"
    )
    p = hv.plan(found, args.gpu, cache_dir())
    for note in p.notes:
        console.print(f"[yellow]note:[/] {note}")
    switches = " ".join(f"{k}={v}" for k, v in p.env.items())
    cached, refused = p.cache_state()  # read once: each read hashes the wheel
    if refused:  # a wheel is there, but not one hpctrain built for this plan: never installed
        console.print(f"[yellow]note:[/] not installing the cached wheel: {refused}; it is built again")
    console.print(f"Horovod {hv.VERSION}: {'cached' if cached else 'to build'} in {p.wheel_dir} ({switches})")
    if found.installed and not args.rebuild and found.installed.split()[0] == hv.VERSION:
        console.print(f"already installed: Horovod {found.installed} (--rebuild builds it again)")
        return 0
    if args.dry_run:
        console.print(
            "patches: " + "; ".join(f"{f}: {old.strip()!r} -> {new.strip()!r}" for f, old, new in hv.PATCHES)
        )
        return 0
    t0 = time.monotonic()
    if args.rebuild or cached is None:
        p.buildable()
        with console.status("building Horovod") as status:
            took = hv.build(
                p,
                python,
                console.print,
                lambda s, line: status.update(f"building Horovod: {s:.0f} s  {line}"),
            )
        console.print(f"built in {took / 60:.1f} min, cached for this user in {p.wheel_dir}")
    hv.install(p, python)
    after = hv.look(python).installed
    if not after:
        raise hv.InstallError(f"Horovod was installed into {python}'s environment but does not import")
    console.print(
        f"[green]installed[/] Horovod {after} in {time.monotonic() - t0:.0f} s: parallelism.engine=horovod runs"
    )
    return 0
