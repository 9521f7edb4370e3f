"""`hpctrain bench memory`: what a rank holds under ddp and fsdp at 1, 2 and 4 ranks, on a
transformer whose parameters and AdamW state dominate (16 layers of width 512: about 50 M
parameters), next to ZeRO-3's expectation: parameters + gradients + optimizer state divided by the
shard count, plus activations (Rajbhandari et al. 2020, arXiv:1910.02054, section 5). The ratio
column is fsdp's state per rank over ddp's at the same world size, measured in one invocation.

Peak memory is the process's peak resident set on CPUs (allocator peak on GPUs): it includes
torch's own runtime and the gathered units of the step, so only the state columns follow 1/N."""

from __future__ import annotations

import argparse
import subprocess
from datetime import datetime
from pathlib import Path

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from hpctrain import records
from hpctrain.bench import hpctrain_run
from hpctrain.errors import LaunchError
from hpctrain.lifeline import with_lifeline

MiB = 2**20


def _argv(run_dir: Path, parallelism: str, ranks: int, a: argparse.Namespace) -> list[str]:
    return hpctrain_run(
        run_dir,
        "model=transformer",
        f"model.width={a.width}",
        f"model.depth={a.depth}",
        "model.heads=8",
        "data=tokens",
        f"data.num_samples={a.batch * ranks * (a.steps + 1)}",
        "optim.name=adamw",
        f"parallelism={parallelism}",
        *(["parallelism.engine=ddp"] if parallelism == "data" else []),
        f"cluster.ranks={ranks}",
        f"train.batch_per_rank={a.batch}",
        f"train.steps={a.steps}",
        "train.warmup_steps=1",
        "train.save_model=false",
        "train.log_interval=1000",
    )


def expected_state(ddp_one_rank: records.RankSummary, shards: int) -> int:
    """ZeRO-3: every rank holds 1/N of the parameters, gradients and optimizer state."""
    return ddp_one_rank.state_bytes // shards


def run_memory_bench(args: argparse.Namespace, console: Console) -> int:
    out = Path(args.out) / datetime.now().strftime("%Y-%m-%d/%H-%M-%S-memory")
    cases = [(p, n) for n in args.ranks for p in ("data", "fsdp")]
    got: dict[tuple[str, int], records.RunSummary] = {}
    with Progress(console=console, transient=True) as bar:
        task = bar.add_task("memory runs", total=len(cases))
        for parallelism, n in cases:
            run_dir = out / f"{parallelism}-n{n}"
            argv = _argv(run_dir, parallelism, n, args)
            r = subprocess.run(with_lifeline(argv), capture_output=True, text=True, timeout=3600)
            if r.returncode != 0:
                raise LaunchError(
                    f"benchmark run failed ({r.returncode}): {' '.join(argv)}\n{r.stderr[-2000:]}"
                )
            got[(parallelism, n)] = records.read(run_dir / records.SUMMARY, records.RunSummary)
            bar.advance(task)
    console.print(_table(args, got))
    console.print(f"runs in {out}")
    return 0


def _table(args: argparse.Namespace, got: dict[tuple[str, int], records.RunSummary]) -> Table:
    first = got[("data", min(args.ranks))]
    whole = first.per_rank[0]
    table = Table(
        title=f"memory per rank: transformer {args.depth}x{args.width} ({first.parameters / 1e6:.1f} M parameters), "
        f"AdamW, batch {args.batch} per rank"
    )
    for col in (
        "parallelism",
        "ranks",
        "params MiB",
        "grads MiB",
        "optim MiB",
        "state MiB",
        "ZeRO-3 expects",
        "fsdp / ddp state",
        "peak MiB",
    ):
        table.add_column(col, justify="right")
    for (parallelism, n), s in sorted(got.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        r = max(s.per_rank, key=lambda x: x.state_bytes)  # the rank holding most
        shards = n if parallelism == "fsdp" else 1
        ddp = got.get(("data", n))
        ratio = (
            r.state_bytes / max(x.state_bytes for x in ddp.per_rank)
            if ddp and parallelism == "fsdp"
            else None
        )
        table.add_row(
            "ddp" if parallelism == "data" else parallelism,
            str(n),
            f"{r.param_bytes / MiB:.1f}",
            f"{r.grad_bytes / MiB:.1f}",
            f"{r.optimizer_bytes / MiB:.1f}",
            f"{r.state_bytes / MiB:.1f}",
            f"{expected_state(whole, shards) / MiB:.1f}",
            f"{ratio:.3f}" if ratio is not None else "",
            f"{max(s.peak_memory_bytes) / MiB:.0f}",
        )
    return table
