"""The options of `hpctrain bench BENCH` (each benchmark's module reads them)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from hpctrain.argtypes import positive_int

if TYPE_CHECKING:
    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]


def add_bench(sub: Subparsers) -> None:
    """`hpctrain bench BENCH`: each benchmark's options."""
    bench = sub.add_parser("bench", help="benchmarks that print ratios measured in one run")
    bsub = bench.add_subparsers(dest="bench", required=True, metavar="BENCH")
    _add_overhead(bsub)
    _add_compile(bsub)
    ar = bsub.add_parser(
        "allreduce", help="Horovod allreduce vs plain MPI, 1 KiB..256 MiB, busbw, alpha-beta fit"
    )
    ar.set_defaults(handler="hpctrain.bench.allreduce:run_bench")
    ar.add_argument("--ranks", type=positive_int, default=2, help="ranks that allreduce")
    ar.add_argument("--max-mb", type=positive_int, default=256, help="largest message, MiB")
    ar.add_argument("--out", default="outputs/bench", help="where the benchmark's runs and results go")
    ba = bsub.add_parser(
        "analyze",
        help="analyze + report synthetic studies of N runs (targets, re-analysis + report: 1,000 runs in "
        "1 s, 10,000 in 4 s)",
    )
    ba.set_defaults(handler="hpctrain.bench.analyze:run_bench")
    ba.add_argument(
        "--runs", type=positive_int, nargs="+", default=[256, 1000], help="study sizes (default: 256 1000)"
    )
    sb = bsub.add_parser(
        "submit", help="plan + submit an N-point single-shape sweep to SLURM; count sbatch calls"
    )
    sb.set_defaults(handler="hpctrain.bench.submit:run_submit")
    sb.add_argument(
        "--points", type=positive_int, nargs="+", default=[256], help="sweep sizes (e.g. 256 10000)"
    )
    sb.add_argument("--out", default="outputs/bench", help="where the benchmark's runs and results go")
    pp = bsub.add_parser(
        "pipeline", help="pipeline step parts (idle vs (p-1)/(m+p-1), transfers, overhead) at m = 1, 2, 4, 8"
    )
    pp.set_defaults(handler="hpctrain.bench.pipeline:run_pipeline_bench")
    pp.add_argument("--stages", type=positive_int, default=2, help="pipeline stages (one rank each)")
    pp.add_argument("--batch", type=positive_int, default=2048, help="samples per step")
    pp.add_argument("--steps", type=positive_int, default=6, help="steps of each run")
    pp.add_argument("--width", type=positive_int, default=1024, help="MLP width")
    pp.add_argument("--depth", type=positive_int, default=8, help="MLP blocks (split evenly over the stages)")
    pp.add_argument(
        "--microbatches", type=positive_int, nargs="+", default=[1, 2, 4, 8], help="micro-batch counts to run"
    )
    pp.add_argument(
        "--schedules",
        nargs="+",
        default=["gpipe", "1f1b"],
        choices=["gpipe", "1f1b", "interleaved_zb", "zbv"],
        help="schedules to run, each at every micro-batch count",
    )
    pp.add_argument("--out", default="outputs/bench", help="where the benchmark's runs and results go")
    _add_model_benches(bsub)


def _add_model_benches(bsub: Subparsers) -> None:
    """The benchmarks of memory, the profiler, start-up and the models' predictions."""
    me = bsub.add_parser("memory", help="per-rank state and peak memory, ddp vs fsdp, against ZeRO-3's 1/N")
    me.set_defaults(handler="hpctrain.bench.memory:run_memory_bench")
    me.add_argument(
        "--ranks", type=positive_int, nargs="+", default=[1, 2, 4], help="world sizes (default 1 2 4)"
    )
    me.add_argument("--width", type=positive_int, default=512, help="transformer d_model (default 512)")
    me.add_argument(
        "--depth", type=positive_int, default=16, help="transformer layers (default 16: ~50 M parameters)"
    )
    me.add_argument("--batch", type=positive_int, default=2, help="sequences per rank")
    me.add_argument("--steps", type=positive_int, default=3, help="steps of each run")
    me.add_argument("--out", default="outputs/bench", help="where the benchmark's runs and results go")
    mp = bsub.add_parser(
        "memory-predict", help="each rank's predicted peak memory vs the run's, 8 layouts and a user model"
    )
    mp.set_defaults(handler="hpctrain.bench.memory_predict:run_memory_predict")
    mp.add_argument("--width", type=positive_int, default=512, help="transformer d_model (default 512)")
    mp.add_argument(
        "--depth", type=positive_int, default=8, help="transformer layers (default 8: ~25 M parameters)"
    )
    mp.add_argument("--batch", type=positive_int, default=16, help="sequences per rank (default 16)")
    mp.add_argument("--steps", type=positive_int, default=4, help="steps of each run")
    mp.add_argument("--cases", nargs="+", default=[], help="only these cases (by label)")
    mp.add_argument("--out", default="outputs/bench", help="where the benchmark's runs and results go")
    pf = bsub.add_parser("profile", help="throughput with the profiler's window over vs the profiler off")
    pf.set_defaults(handler="hpctrain.bench.profile:run_profile_bench")
    pf.add_argument("--ranks", type=positive_int, default=2, help="ranks of each run")
    pf.add_argument("--repeats", type=positive_int, default=3, help="interleaved runs of each (default 3)")
    pf.add_argument("--steps", type=positive_int, default=60, help="steps of each run")
    pf.add_argument(
        "--warmup", type=positive_int, default=10, help="warm-up steps; the window lies inside them"
    )
    pf.add_argument("--out", default="outputs/bench", help="where the benchmark's runs and results go")
    st = bsub.add_parser("startup", help="a rank's CPU to its first step: torch's optimizers vs hpctrain's")
    st.set_defaults(handler="hpctrain.bench.startup:run_startup")
    st.add_argument(
        "--repeats", type=positive_int, default=5, help="interleaved processes of each (default 5)"
    )
    es = bsub.add_parser(
        "estimate", help="--estimate's wall time and node-hours against a study run right after"
    )
    es.set_defaults(handler="hpctrain.bench.estimate:run_estimate_bench")
    es.add_argument(
        "--cluster",
        choices=["local", "slurm"],
        default="local",
        help="where the study runs (slurm: slurm/start.sh's cluster)",
    )
    es.add_argument(
        "--scales", type=positive_int, nargs="+", default=[1, 2], help="ranks (local) or nodes (slurm)"
    )
    es.add_argument("--reps", type=positive_int, default=2, help="runs per scale (default 2: 4 runs)")
    es.add_argument("--steps", type=positive_int, default=300, help="steps of each run of the study")
    es.add_argument("--batch", type=positive_int, default=64, help="global batch (default 64)")
    es.add_argument("--out", default="outputs/bench", help="where the benchmark's runs and results go")
    tu = bsub.add_parser("tune", help="hpctrain tune's best settings vs the config as given, interleaved")
    tu.set_defaults(handler="hpctrain.bench.tune:run_tune_bench")
    tu.add_argument(
        "overrides", nargs="*", metavar="KEY=VALUE", help="the config (default: an MLP on 2 ranks)"
    )
    tu.add_argument("--repeats", type=positive_int, default=3, help="interleaved runs of each (default 3)")
    tu.add_argument("--steps", type=positive_int, default=200, help="steps of each run (default 200)")
    tu.add_argument("--budget-min", type=float, default=5.0, help="the tune's budget (default 5 min)")
    tu.add_argument("--out", default="outputs/bench", help="where the benchmark's runs and results go")
    pr = bsub.add_parser(
        "predict", help="the step model against published results, and its errors on recorded studies"
    )
    pr.set_defaults(handler="hpctrain.bench.predict:run_predict")
    pr.add_argument(
        "studies",
        nargs="*",
        metavar="STUDY_DIR",
        help="study directories (hpctrain study ...), after the published results",
    )


def _add_overhead(bsub: Subparsers) -> None:
    ov = bsub.add_parser(
        "overhead",
        help="hpctrain's training throughput vs minimal hand-written Horovod and DDP scripts and a "
        "no-communication ceiling (target: each engine >= 0.97 of its script)",
    )
    ov.set_defaults(handler="hpctrain.bench.overhead:run_overhead")
    ov.add_argument("--ranks", type=positive_int, default=2, help="ranks of each run")
    ov.add_argument("--repeats", type=positive_int, default=3, help="interleaved runs of each (default 3)")
    ov.add_argument(
        "--steps", type=positive_int, help="per run, a tenth warm-up (default: cpu 60, cuda 400; tiny: 1000)"
    )
    ov.add_argument("--batch", type=positive_int, help="per-rank batch (default 64; tiny: 1)")
    ov.add_argument("--out", default="outputs/bench", help="where the runs' directories go")
    ov.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="cuda: one GPU per rank")
    ov.add_argument(
        "--model",
        choices=("cnn", "mlp", "tiny"),
        default="cnn",
        help="cnn: compute-bound; mlp: 2 hidden layers of 2048 (42 MB of gradients: communication-bound); "
        "tiny: one hidden layer of 16 at batch 1 (the host's work per step shows)",
    )
    ov.add_argument(
        "--engines",
        nargs="+",
        choices=("horovod", "ddp", "fsdp"),
        default=["horovod", "ddp"],
        help="the ways of averaging gradients compared, each hpctrain's against its minimal script "
        "(fsdp: parallelism=fsdp against fully_shard by hand)",
    )
    ov.add_argument(
        "--starter",
        choices=("mpirun", "spawn"),
        default="mpirun",
        help="spawn: without MPI (cluster.starter)",
    )


def _add_compile(bsub: Subparsers) -> None:
    co = bsub.add_parser(
        "compile", help="the transformer eager and compiled (train.compile): step time and compile time"
    )
    co.set_defaults(handler="hpctrain.bench.compile:run_compile_bench")
    co.add_argument("--ranks", type=positive_int, default=1, help="ranks of each run")
    co.add_argument("--repeats", type=positive_int, default=2, help="interleaved runs of each (default 2)")
    co.add_argument("--steps", type=positive_int, default=40, help="steps of each run (a fifth warm-up)")
    co.add_argument("--batch", type=positive_int, default=8, help="per-rank batch")
    co.add_argument("--width", type=positive_int, default=256, help="model width")
    co.add_argument("--depth", type=positive_int, default=4, help="transformer blocks")
    co.add_argument("--heads", type=positive_int, default=4, help="attention heads")
    co.add_argument("--seq-len", type=positive_int, default=128, help="tokens per sample")
    co.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="cuda: one GPU per rank")
    co.add_argument("--precision", choices=("fp32", "bf16"), default="fp32", help="precision of both sides")
    co.add_argument("--out", default="outputs/bench", help="where the runs' directories go")
