"""`hpctrain bench overhead`: training launched by hpctrain, with each engine, against minimal
hand-written Horovod and DDP scripts and against the no-communication ceiling (the same per-rank
work in independent processes started together), all with the same model, batch, ranks, threads
and timing. The contenders run interleaved, each repeat in a rotated order, so that machine noise
and drift hit all alike; ratios are of medians taken in this one run."""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from hpctrain import records
from hpctrain.bench import hpctrain_run, run_checked
from hpctrain.bench.minimal import throughput
from hpctrain.errors import ConfigError
from hpctrain.facts import free_tcp_port
from hpctrain.launch.local.plan import mpirun_prefix

TARGET_OWN = 0.97  # each hpctrain engine against its own hand-written script
TARGET_CEILING = 0.95  # hpctrain's faster engine against the no-communication ceiling
# steps per run: a CPU step of the CNN takes about 10 ms, a GPU step about 2 (host-bound: the GPU
# computes for under 1 ms of it), so 60 GPU steps time ~0.1 s and the contenders' runs spread by 25%
DEFAULT_STEPS = {"cpu": 60, "cuda": 400}
TINY_STEPS, TINY_BATCH, BATCH = 1000, 1, 64  # tiny: a step of about a millisecond
ENGINES = ("horovod", "ddp")  # the default pairs; fsdp on request (--engines)
MODELS = {
    "cnn": ("model=cnn",),
    "mlp": ("model=mlp", "model.width=2048", "model.depth=2"),
    # one hidden layer of 16: a step of microseconds of compute, so the host's work per step shows
    "tiny": ("model=mlp", "model.width=16", "model.depth=1"),
}
LR = {"tiny": 0.005}  # batch 1 on random labels: 0.05 diverges within 300 steps (else the default)


def lr_of(model: str) -> float:
    """The learning rate both sides of a model's contest train with."""
    return LR.get(model, 0.05)


# how hpctrain runs each contender's way of averaging gradients
HPCTRAIN_WAY = {
    "horovod": ("parallelism.engine=horovod",),
    "ddp": ("parallelism.engine=ddp",),
    "fsdp": ("parallelism=fsdp", "parallelism.engine=ddp"),
}


@dataclass(frozen=True)
class Setup:
    """What every contender shares: the world, the work, where it runs and how it starts."""

    ranks: int
    threads: int
    batch: int
    steps: int
    warmup: int
    device: str = "cpu"  # cpu | cuda (one GPU per rank)
    starter: str = "mpirun"  # mpirun | spawn (as torchrun starts processes: no MPI)
    model: str = "cnn"  # cnn | mlp (2 hidden layers of 2048: communication-bound)
    engines: tuple[str, ...] = ENGINES


def _minimal_argv(engine: str, s: Setup) -> list[str]:
    env = [f"OMP_NUM_THREADS={s.threads}", "MASTER_ADDR=127.0.0.1", f"MASTER_PORT={free_tcp_port()}"]
    if s.starter == "spawn":
        argv = [sys.executable, "-m", "hpctrain.launch.local.spawn", "-np", str(s.ranks)]
    else:
        argv, _ = mpirun_prefix(s.ranks, len(os.sched_getaffinity(0)), os.geteuid() == 0)
    for var in env:
        argv += ["-x", var]
    argv += ["--"] if s.starter == "spawn" else []
    argv += [sys.executable, "-m", "hpctrain.bench.minimal", "--engine", engine, "--device", s.device]
    argv += ["--model", s.model, "--lr", str(lr_of(s.model))]
    return argv + ["--batch", str(s.batch), "--steps", str(s.steps), "--warmup", str(s.warmup)]


def hpctrain_argv(engine: str, run_dir: Path, s: Setup) -> list[str]:
    return hpctrain_run(
        run_dir,
        *MODELS[s.model],
        f"optim.lr={lr_of(s.model)}",
        "data=synthetic",
        "data.num_samples=4096",
        f"cluster.ranks={s.ranks}",
        f"cluster.starter={s.starter}",
        f"train.device={s.device}",
        f"train.batch_per_rank={s.batch}",
        f"train.steps={s.steps}",
        f"train.warmup_steps={s.warmup}",
        "train.save_model=false",
        "train.log_interval=1000",
        *HPCTRAIN_WAY[engine],
    )


def contenders(s: Setup, horovod: bool, horovod_nccl: bool) -> tuple[list[str], str]:
    """Who runs, and why any is left out: the ceiling, then for each engine asked for its minimal
    script and hpctrain; Horovod's where it is installed (with NCCL on GPUs) and started by mpirun
    (a hand-written Horovod script meets the others through MPI)."""
    why = ""
    if "horovod" in s.engines and s.starter == "spawn":
        why = "spawn starts no MPI: Horovod's contenders are left out"
    elif "horovod" in s.engines and not horovod:
        why = "Horovod is not installed: its contenders are left out"
    elif "horovod" in s.engines and s.device == "cuda" and not horovod_nccl:
        why = "Horovod has no NCCL: its contenders are left out"
    engines = [e for e in s.engines if not (e == "horovod" and why)]
    return ["ceiling", *(f"minimal {e}" for e in engines), *(f"hpctrain {e}" for e in engines)], why


def _measure(who: str, i: int, out: Path, s: Setup) -> float:
    kind, engine = who.split(" ") if " " in who else ("minimal", "none")
    if kind == "hpctrain":
        run_dir = out / f"hpctrain-{engine}-{i}"
        run_checked(hpctrain_argv(engine, run_dir, s))
        return float(records.read(run_dir / records.SUMMARY, records.RunSummary).throughput_samples_per_s)
    return throughput(run_checked(_minimal_argv(engine, s)), s.batch, s.steps, s.warmup)


def added_us(mine: float, minimal: float, s: Setup) -> float:
    """Microseconds a step takes beyond the minimal loop's, from two throughputs (global samples/s
    of a global batch of ranks x batch): a step is the global batch over the throughput."""
    return 1e6 * s.ranks * s.batch * (1 / mine - 1 / minimal)


def _horovod() -> tuple[bool, bool]:
    """(installed, built with NCCL), asked in a subprocess: importing it here would start nothing,
    but a benchmark should not hold Horovod's library in its own process."""
    code = "import horovod.torch as h; print(int(h.nccl_built()))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    return r.returncode == 0, r.stdout.strip() == "1"


def run_overhead(args: argparse.Namespace, console: Console) -> int:
    tiny = args.model == "tiny"
    steps = args.steps or (TINY_STEPS if tiny else DEFAULT_STEPS[args.device])
    batch = args.batch or (TINY_BATCH if tiny else BATCH)
    if steps < 2:  # one warm-up step and at least one timed step
        raise ConfigError.one("--steps", f"must be at least 2 (got {steps})", "e.g. --steps 60")
    cores = len(os.sched_getaffinity(0))
    s = Setup(
        args.ranks,
        max(1, cores // args.ranks),
        batch,
        steps,
        max(1, steps // 10),
        args.device,
        args.starter,
        args.model,
        tuple(dict.fromkeys(args.engines)),
    )
    who, left_out = contenders(s, *_horovod())
    out = Path(args.out) / datetime.now().strftime("%Y-%m-%d/%H-%M-%S-overhead")
    got: dict[str, list[float]] = {c: [] for c in who}
    with Progress(console=console, transient=True) as bar:
        task = bar.add_task("interleaved runs", total=len(who) * args.repeats)
        for i in range(args.repeats):
            # rotated order: no contender always runs first (caches, clocks and neighbours drift)
            k = i % len(who)
            for c in who[k:] + who[:k]:
                got[c].append(_measure(c, i, out, s))
                bar.advance(task)
    med = {c: statistics.median(v) for c, v in got.items()}
    table = Table(
        title=f"overhead: {' '.join(MODELS[s.model])}, synthetic 3x32x32, {s.ranks} ranks x batch {s.batch} on {s.device} "
        f"({s.starter}), {s.steps} steps ({s.warmup} warm-up), {s.threads} thread(s)/rank, "
        f"{args.repeats} repeats"
    )
    for col in ("contender", "samples/s (median)", "runs", "/ ceiling", "/ own minimal", "added µs/step"):
        table.add_column(col, justify="right")
    for c in who:
        mine = med.get("minimal " + c.split()[-1])
        own = f"{med[c] / mine:.3f}" if c.startswith("hpctrain") and mine else ""
        added = f"{added_us(med[c], mine, s):.0f}" if c.startswith("hpctrain") and mine else ""
        runs = " ".join(f"{v:.0f}" for v in got[c])
        table.add_row(c, f"{med[c]:.1f}", runs, f"{med[c] / med['ceiling']:.3f}", own, added)
    console.print(table)
    if left_out:
        console.print(left_out, highlight=False)
    engines = [c.split()[1] for c in who if c.startswith("hpctrain")]
    best = max(med[f"hpctrain {e}"] for e in engines) / med["ceiling"]
    verdicts = [("hpctrain's faster engine / ceiling", best, TARGET_CEILING)] + [
        (f"hpctrain {e} / minimal {e}", med[f"hpctrain {e}"] / med[f"minimal {e}"], TARGET_OWN)
        for e in engines
    ]
    for label, ratio, target in verdicts:
        verdict = "[green]meets[/]" if ratio >= target else "[red]below[/]"
        console.print(f"{label} = {ratio:.3f} ({verdict} the {target} target)")
    console.print(f"runs in {out}")
    return 0
