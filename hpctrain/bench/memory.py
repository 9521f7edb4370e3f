"""`hpctrain bench memory`: what a rank holds under ddp, fsdp, tensor parallelism (tp: the world's
ranks one group) and 2-D TP x FSDP (tp 2 x fsdp N/2) at 1, 2 and 4 ranks, on a transformer whose
parameters and AdamW state dominate (16 layers of width 512: about 50 M parameters), next to the
1/N expectation: parameters + gradients + optimizer state divided by the ranks that split them
(ZeRO-3: Rajbhandari et al. 2020, arXiv:1910.02054, section 5; tensor parallelism splits all but
the norms and position embeddings, Shoeybi et al. 2019). The ratio columns are each layout's
state and peak per rank over ddp's at the same world size, measured in one invocation.

Peak memory is the process's peak resident set on CPUs (allocator peak on GPUs): it includes
torch's own runtime (a few hundred MiB on CPUs) and the gathered units of the step. The runs fix
glibc's mmap threshold so that freed blocks leave the process, as the CUDA allocator's peak
counts only live memory. Sharded and
tensor-parallel models are built on the meta device and each rank draws only its slices
(train/materialize.py), so no rank ever holds the whole model."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from hpctrain import records
from hpctrain.bench import hpctrain_run, run_checked

MiB = 2**20


@dataclass(frozen=True)
class Case:
    """One row of the table: a layout, by the overrides that make it, and whether every rank
    holds 1/N of the state (ZeRO-3's expectation) or all of it."""

    label: str
    overrides: tuple[str, ...]
    divides_state: bool
    least_ranks: int = 1  # below this world size the case is the same as ddp's: not run
    tp: str = ""  # the tensor-parallel degree: "world", or a number

    def argv(self, ranks: int) -> tuple[str, ...]:
        degree = str(ranks) if self.tp == "world" else self.tp
        return (*self.overrides, *([f"parallelism.tp.degree={degree}"] if degree else ()))


CASES = (
    Case("ddp", ("parallelism=data", "parallelism.engine=ddp"), divides_state=False),
    Case("fsdp", ("parallelism=fsdp",), divides_state=True),
    Case("tp", ("parallelism=data", "parallelism.engine=ddp"), divides_state=True, least_ranks=2, tp="world"),
    Case("tp2 x fsdp", ("parallelism=fsdp",), divides_state=True, least_ranks=4, tp="2"),
)
BASELINE = CASES[0]  # what the ratio columns divide by


def _argv(run_dir: Path, case: Case, ranks: int, a: argparse.Namespace) -> list[str]:
    return hpctrain_run(
        run_dir,
        "model=transformer",
        f"model.width={a.width}",
        f"model.depth={a.depth}",
        "model.heads=8",
        "data=tokens",
        f"data.num_samples={a.batch * ranks * (a.steps + 1)}",
        "optim.name=adamw",
        *case.argv(ranks),
        f"cluster.ranks={ranks}",
        f"train.batch_per_rank={a.batch}",  # per replica: a tensor-parallel group reads one batch
        f"train.steps={a.steps}",
        "train.warmup_steps=1",
        "train.save_model=false",
        "train.log_interval=1000",
        # freed blocks leave the process at once: glibc's dynamic mmap threshold otherwise keeps
        # freed parameter and gradient buffers resident, and the peak resident set then counts
        # memory that is no longer live (measured: fsdp at 4 ranks 1453 MiB, 718 with it fixed)
        "+cluster.env.MALLOC_MMAP_THRESHOLD_=131072",
    )


def expected_state(ddp_one_rank: records.RankSummary, shards: int) -> int:
    """ZeRO-3: every rank holds 1/N of the parameters, gradients and optimizer state."""
    return ddp_one_rank.state_bytes // shards


def run_memory_bench(args: argparse.Namespace, console: Console) -> int:
    out = Path(args.out) / datetime.now().strftime("%Y-%m-%d/%H-%M-%S-memory")
    cases = [(c, n) for n in args.ranks for c in CASES if n >= c.least_ranks]
    got: dict[tuple[Case, int], records.RunSummary] = {}
    with Progress(console=console, transient=True) as bar:
        task = bar.add_task("memory runs", total=len(cases))
        for case, n in cases:
            run_dir = out / f"{case.label.replace(' ', '')}-n{n}"
            argv = _argv(run_dir, case, n, args)
            run_checked(argv, timeout_s=3600)
            got[(case, n)] = records.read(run_dir / records.SUMMARY, records.RunSummary)
            bar.advance(task)
    console.print(_table(args, got))
    console.print(f"runs in {out}")
    return 0


def _table(args: argparse.Namespace, got: dict[tuple[Case, int], records.RunSummary]) -> Table:
    first = got[(BASELINE, min(args.ranks))]
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
        "1/N expects",
        "state / ddp's",
        "peak MiB",
        "peak / ddp's",
    ):
        table.add_column(col, justify="right")
    for (case, n), s in sorted(got.items(), key=lambda kv: (kv[0][1], CASES.index(kv[0][0]))):
        r = max(s.per_rank, key=lambda x: x.state_bytes)  # the rank holding most
        shards = n if case.divides_state else 1
        ddp = got.get((BASELINE, n))
        ratio = r.state_bytes / max(x.state_bytes for x in ddp.per_rank) if ddp and case != BASELINE else None
        peak = max(s.peak_memory_bytes) / max(ddp.peak_memory_bytes) if ddp and case != BASELINE else None
        table.add_row(
            case.label,
            str(n),
            f"{r.param_bytes / MiB:.1f}",
            f"{r.grad_bytes / MiB:.1f}",
            f"{r.optimizer_bytes / MiB:.1f}",
            f"{r.state_bytes / MiB:.1f}",
            f"{expected_state(whole, shards) / MiB:.1f}",
            f"{ratio:.3f}" if ratio is not None else "",
            f"{max(s.peak_memory_bytes) / MiB:.0f}",
            f"{peak:.2f}" if peak is not None else "",
        )
    return table
