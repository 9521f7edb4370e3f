"""`hpctrain bench allreduce`: Horovod allreduce, torch.distributed all_reduce (what DDP uses) and
plain MPI over message sizes, beside torch.distributed's all-gather and reduce-scatter (what FSDP
uses), with algorithm and bus bandwidth as nccl-tests defines them, and the
alpha-beta (Hockney) fit of the times."""

from __future__ import annotations

import argparse
from datetime import datetime
from pathlib import Path

from rich.console import Console
from rich.table import Table

from hpctrain import records
from hpctrain.analysis.metrics import allreduce_bandwidths, gather_bandwidths
from hpctrain.analysis.model import fit_alpha_beta
from hpctrain.config.load import load_config
from hpctrain.launch.registry import launcher_for
from hpctrain.orchestrate.probe import run_allreduce


def _human(b: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if b < 1024:
            return f"{b:.0f} {unit}"
        b /= 1024
    return f"{b:.0f} TiB"


def table(result: records.AllreduceResult) -> Table:
    n = result.n
    t = Table(
        title=f"allreduce over {n} ranks: Horovod, torch.distributed and plain MPI ({result.mpi_library})"
    )
    cols = ("size", "hvd time", "hvd busbw", "torch time", "torch busbw", "MPI time", "MPI busbw")
    for col in (*cols, "all-gather", "ag busbw", "reduce-scatter", "rs busbw"):
        t.add_column(col, justify="right")
    for row in result.rows:
        cells = [_human(row.bytes)]
        for seconds in (row.hvd_s, row.torch_s, row.mpi_s):
            _, bus = allreduce_bandwidths(row.bytes, seconds, n)
            cells += [f"{1e6 * seconds:.0f} µs", f"{bus / 1e9:.2f} GB/s"]
        for seconds in (row.allgather_s, row.reduce_scatter_s):  # FSDP's collectives (torch.distributed)
            _, bus = gather_bandwidths(row.bytes, seconds, n) if n > 1 else (0.0, 0.0)
            cells += [f"{1e6 * seconds:.0f} µs", f"{bus / 1e9:.2f} GB/s"]
        t.add_row(*cells)
    return t


def run_bench(args: argparse.Namespace, console: Console) -> int:
    out_dir = Path(args.out) / datetime.now().strftime("%Y-%m-%d/%H-%M-%S-allreduce")
    out = out_dir / records.allreduce_file(args.ranks)
    cfg = load_config([f"cluster.ranks={args.ranks}"])
    with console.status(f"allreduce benchmark on {args.ranks} ranks"):
        # an ordinary local run of the allreduce workload: supervisor, mpirun, records
        result = run_allreduce(launcher_for(cfg), cfg, out_dir, args.max_mb)
    console.print(table(result))
    if args.ranks > 1:
        ab = fit_alpha_beta([(r.n, r.bytes, r.hvd_s) for r in result.rows])
        console.print(
            f"alpha-beta fit (Horovod): alpha = {1e6 * ab.alpha_s:.1f} µs per step, "
            f"beta = 1/({ab.bandwidth_bytes_per_s / 1e9:.2f} GB/s); records: {out}"
        )
    return 0
