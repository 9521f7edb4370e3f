"""`hpctrain bench memory-predict`: each rank's predicted peak memory (memory/predict.py, what
`--estimate` prints and what refuses a point that cannot fit) against the peak the run then
reports, for ddp, horovod, fsdp, TP, TP x FSDP, a GPipe pipeline, activation checkpointing and a
user model (`_target_`: a residual MLP the benchmark writes into its directory), in one invocation.
The target is predicted / measured within 15% for every case (TARGET).

On CPUs the reported peak is the rank's resident set after the warm-up (train/memory.py). The
runs fix glibc's mmap threshold (MALLOC_MMAP_THRESHOLD_) so that freed blocks leave the process,
as the CUDA allocator's peak counts only live memory: without it glibc keeps freed parameter and
gradient buffers resident, which no prediction of live tensors can see (`hpctrain bench memory`)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from hpctrain import records
from hpctrain.analysis.memory import MiB, Prediction
from hpctrain.bench import hpctrain_run, run_checked

TARGET = 0.15
MALLOC = "+cluster.env.MALLOC_MMAP_THRESHOLD_=131072"
USER_MODEL = '''"""A user's model: a residual MLP over flattened images (hpctrain bench memory-predict)."""
import torch
from torch import nn


class ResidualMLP(nn.Module):
    def __init__(self, features: int = 3072, width: int = 1024, depth: int = 6, classes: int = 10) -> None:
        super().__init__()
        self.inp = nn.Linear(features, width)
        self.blocks = nn.ModuleList(nn.Sequential(nn.LayerNorm(width), nn.Linear(width, width), nn.GELU()) for _ in range(depth))
        self.out = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x.flatten(1))
        for block in self.blocks:
            h = h + block(h)
        return self.out(h)
'''


@dataclass(frozen=True)
class Case:
    label: str
    overrides: tuple[str, ...]
    ranks: int = 2
    user: bool = False  # the user model (run from the directory that holds it)


DDP = ("parallelism=data", "parallelism.engine=ddp")
CASES = (
    Case("ddp", DDP),
    Case("horovod", ("parallelism=data", "parallelism.engine=horovod")),
    Case("fsdp", ("parallelism=fsdp",)),
    Case("tp", (*DDP, "parallelism.tp.degree=2")),
    Case("tp2 x fsdp2", ("parallelism=fsdp", "parallelism.tp.degree=2"), ranks=4),
    Case(
        "gpipe 2 stages",
        (
            "parallelism=pipeline",
            "parallelism.stages=2",
            "parallelism.microbatches=4",
            "parallelism.schedule=gpipe",
        ),
    ),
    Case("ddp + checkpointing", (*DDP, "model.activation_checkpointing=true")),
    Case("user model, ddp", DDP, user=True),
)


def model_overrides(case: Case, a: argparse.Namespace) -> list[str]:
    if case.user:
        return ["model._target_=bench_user.ResidualMLP", f"data.num_samples={a.batch * case.ranks * 4}"]
    return [
        "model=transformer",
        f"model.width={a.width}",
        f"model.depth={a.depth}",
        "model.heads=8",
        "data=tokens",
        f"data.num_samples={a.batch * case.ranks * 4}",
    ]


def overrides(case: Case, a: argparse.Namespace) -> list[str]:
    return [
        *model_overrides(case, a),
        "optim.name=adamw",
        *case.overrides,
        f"cluster.ranks={case.ranks}",
        f"train.batch_per_rank={a.batch}",
        f"train.steps={a.steps}",
        "train.warmup_steps=1",
        "train.save_model=false",
        "train.log_interval=1000",
        MALLOC,
    ]


def predicted(case: Case, a: argparse.Namespace, user_dir: Path) -> Prediction:
    """The prediction, made as `--estimate` makes it (in this process, on the meta of the world)."""
    import os
    import sys

    from hpctrain.config.load import load_config
    from hpctrain.memory.predict import predict

    here = os.getcwd()
    try:
        if case.user:
            os.chdir(user_dir)
            sys.path.insert(0, str(user_dir))
        return predict(load_config(overrides(case, a)), gpus=False)
    finally:
        os.chdir(here)
        if case.user:
            sys.path.remove(str(user_dir))


def measured(case: Case, a: argparse.Namespace, run_dir: Path, user_dir: Path) -> list[int]:
    """The reported peak of each pipeline stage's worst rank (one figure without stages)."""
    argv = hpctrain_run(run_dir, *overrides(case, a))
    run_checked(argv, timeout_s=1800, cwd=user_dir if case.user else None)
    s = records.read(run_dir / records.SUMMARY, records.RunSummary)
    return list(s.peak_by_stage)


def run_memory_predict(args: argparse.Namespace, console: Console) -> int:
    out = Path(args.out).resolve() / datetime.now().strftime("%Y-%m-%d/%H-%M-%S-memory-predict")
    user_dir = out / "user"
    user_dir.mkdir(parents=True)
    (user_dir / "bench_user.py").write_text(USER_MODEL)
    cases = [c for c in CASES if not args.cases or c.label in args.cases]
    rows = []
    with Progress(console=console, transient=True) as bar:
        task = bar.add_task("predict and run", total=len(cases))
        for case in cases:
            p = predicted(case, args, user_dir)
            got = measured(
                case, args, out / "".join(ch if ch.isalnum() else "-" for ch in case.label), user_dir
            )
            rows.append((case, p, got))
            bar.advance(task)
    console.print(table(rows, args))
    worst = max(abs(_ratio(p, got) - 1) for _, p, got in rows)
    console.print(
        f"worst |predicted / measured - 1| = {worst:.1%} (target {TARGET:.0%}); runs in {out}",
        highlight=False,
    )
    return 0


def _ratio(p: Prediction, got: list[int]) -> float:
    """The worst stage's prediction over the worst stage's measurement."""
    return max(r.reported for r in p.ranks) / max(got)


def table(rows: list[tuple[Case, Prediction, list[int]]], a: argparse.Namespace) -> Table:
    t = Table(
        title=f"memory per rank, predicted vs measured: transformer {a.depth}x{a.width}, AdamW, batch {a.batch} per rank",
        caption="predicted: memory/predict.py (params + grads + optimizer + activations + buffers + data + fixed)",
    )
    for col in (
        "case",
        "ranks",
        "params",
        "grads",
        "optim",
        "act",
        "buffers",
        "fixed",
        "predicted",
        "measured",
        "ratio",
    ):
        t.add_column(col, justify="left" if col == "case" else "right")
    for case, p, got in rows:
        w = max(p.ranks, key=lambda r: r.reported)
        ratio = _ratio(p, got)
        mark = "" if abs(ratio - 1) <= TARGET else " [red]off[/]"
        t.add_row(
            case.label,
            str(case.ranks),
            *(f"{v / MiB:.0f}" for v in (w.params, w.grads, w.optimizer, w.activations, w.buffers, w.fixed)),
            f"{w.reported / MiB:.0f}",
            f"{max(got) / MiB:.0f}",
            f"{ratio:.2f}{mark}",
        )
    return t
