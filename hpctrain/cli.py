"""The `hpctrain` command. Library code raises typed errors; this module turns them into messages
and exit codes (0 ok, 1 other error or an unreadable record, 2 invalid config or arguments,
3 launch error, 4 a rank failed, 130 interrupted or cancelled). Nothing ends in a traceback: an
unexpected exception is one line that says it is a bug (HPCTRAIN_DEBUG=1 shows the traceback)."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.text import Text

from hpctrain import records
from hpctrain.argtypes import positive_float
from hpctrain.bench.args import add_bench
from hpctrain.commands.ui import make_console
from hpctrain.errors import HpctrainError

if TYPE_CHECKING:
    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]

EPILOG = """examples:
  hpctrain run                                   2-rank local run of the default CNN
  hpctrain run cluster.ranks=4 precision=bf16    Hydra overrides: key=value, group=option
  hpctrain run model=transformer data=tokens --dry-run
  hpctrain run cluster=slurm cluster.nodes=2 cluster.ranks_per_node=2
  hpctrain run -m cluster=slurm cluster.nodes=1,2 precision=fp32,bf16
  hpctrain status outputs/2026-01-01/12-00-00-train-sweep
  hpctrain study strong study.ranks=[1,2] model=resnet18   strong scaling study + report
  hpctrain study strong study.ranks=[1,2] --estimate       its time and node-hours beforehand
  hpctrain run cluster=slurm cluster.nodes=8 --estimate --from RUN_OR_STUDY_DIR
  hpctrain analyze outputs/<date>/<time>-train-strong      re-analyze a study
  hpctrain tune model=mlp parallelism.engine=ddp tune.target_ranks=16   the fastest settings
  hpctrain track outputs/<date>/<time>-train --uri URI      send a run to MLflow later
  hpctrain doctor                                what this environment can do
  hpctrain install horovod                       build Horovod for this environment (no root)
  hpctrain bench overhead                        hpctrain vs a hand-written Horovod script
  hpctrain bench submit                          256-point sweep: submit time, sbatch calls
  hpctrain bench startup                         a rank's start: torch's optimizers vs hpctrain's
  hpctrain bench pipeline                        pipeline step parts: idle vs theory, transfers, overhead
  hpctrain bench memory                          state per rank, ddp vs fsdp, vs ZeRO-3's 1/N
  hpctrain bench profile                         the profiler's cost once its window is over
  hpctrain bench predict [STUDY_DIR]             the step model vs published results; its errors on studies
  hpctrain bench estimate                        --estimate's wall time and node-hours vs the runs
  hpctrain bench tune                            hpctrain tune's best settings vs the config as given
"""


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help="Hydra overrides, e.g. model=resnet18 train.steps=100 cluster.ranks=4",
    )
    p.add_argument(
        "--config-dir",
        metavar="DIR",
        help="a directory of extra config groups and options (e.g. cluster/mysite.yaml), searched after "
        "hpctrain's own and before $HPCTRAIN_CONFIG_PATH and ~/.config/hpctrain (hpctrain doctor lists them)",
    )
    p.add_argument(
        "--overrides-file",
        type=Path,
        metavar="FILE",
        help="a YAML list of overrides applied before those on the command line (e.g. the "
        "best.yaml of hpctrain tune)",
    )


def _add_estimate(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--estimate",
        action="store_true",
        help="predict every point's step time, throughput, wall time, node-hours and core-hours "
        "with intervals, and the total; submit nothing (locally a short probe of each point runs)",
    )
    p.add_argument(
        "--from",
        dest="estimate_from",
        type=Path,
        metavar="DIR",
        help="with --estimate: the earlier run, study or tune (its best trial) of this config to estimate "
        "from (no probe)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hpctrain",
        description="Distributed Horovod training from Hydra configs, locally "
        "with mpirun or on SLURM, with scaling analysis.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    from hpctrain import __version__

    parser.add_argument("--version", action="version", version=f"hpctrain {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_run(sub)
    _add_jobs(sub)
    _add_study(sub)
    _add_tune(sub)
    tr = sub.add_parser(
        "track",
        help="send a run, sweep or study to MLflow / TensorBoard from its records (again: never twice)",
        description="Logs what is new of a run, sweep or study directory: where its config's "
        "tracking.* says, else to MLflow's default store (sqlite:///<run.output_root>/mlflow.db). "
        "Runs of an offline cluster are sent later from a login node this way.",
    )
    tr.add_argument("path", type=Path, help="a run, sweep or study directory")
    tr.add_argument("--uri", help="an MLflow tracking URI (a server, or sqlite:///path.db)")
    tr.add_argument("--tensorboard", action="store_true", help="also write TensorBoard event files")
    sub.add_parser("doctor", help="report what this environment can do, and how to fix what is missing")
    ins = sub.add_parser(
        "install",
        help="build and install Horovod for this environment (no root; cached per user)",
        description="horovod: Horovod 0.28.1 built from its source release for this environment's torch "
        "and Python, with the MPI (mpicxx) and CUDA (nvcc) found on PATH (load them first: module load "
        "openmpi cuda), patched for PyTorch 2 and Python 3.12; cached in ~/.cache/hpctrain/wheels, so "
        "another environment with the same torch and Python installs it in seconds.",
    )
    ins.add_argument("what", choices=["horovod"])
    ins.add_argument(
        "--gpu",
        choices=["auto", "nccl", "none"],
        default="auto",
        help="NCCL GPU operations: auto (where torch is a CUDA build and nvcc is found), nccl, none",
    )
    ins.add_argument("--rebuild", action="store_true", help="build again, even if cached or installed")
    ins.add_argument("--dry-run", action="store_true", help="say what would be built, and stop")
    pf = sub.add_parser(
        "preflight",
        help="check the nodes a run would train on (a GEMM each, a ring of links) and stop",
        description="Starts the ranks the config's run would start (locally, or a short SLURM job) "
        "and runs only its pre-flight check (cluster.preflight.*): every node's compute and links, "
        "judged against the job's own median and any reference. Exit 0 when every node is good, "
        "4 when one is bad.",
    )
    _add_config_args(pf)
    pf.add_argument("--dry-run", action="store_true", help="print the plan; start nothing")
    pf.add_argument(
        "--timeout-min", type=positive_float, default=60, help="stop waiting after this many minutes"
    )
    _add_container(sub)
    add_bench(sub)
    return parser


def _add_container(sub: Subparsers) -> None:
    ct = sub.add_parser(
        "container",
        help="build the training image with Charliecloud (cluster.container.runtime=charliecloud)",
        description="build: a Debian 12 image from debootstrap, with this machine's wheels (torch, "
        "mpi4py, Horovod, every dependency at the venv's versions) installed by scripts/setup.sh, "
        "offline; cached by what went into it. show: the digest of a built image.",
    )
    ct.add_argument("action", choices=["build", "show"])
    ct.add_argument("--tag", default="hpctrain", help="image name in ch-image storage (default: hpctrain)")
    ct.add_argument("--storage", help="ch-image storage directory (default: ~/.cache/hpctrain/charliecloud)")
    ct.add_argument("--force", action="store_true", help="build again even if the cached image is current")


def _add_run(sub: Subparsers) -> None:
    run = sub.add_parser(
        "run",
        help="train with the given config overrides",
        description="Compose the config, validate it, plan the launch and run it.",
    )
    _add_config_args(run)
    run.add_argument(
        "--dry-run",
        action="store_true",
        help="print the resolved config and the exact launch command; start nothing",
    )
    run.add_argument(
        "--cfg", action="store_true", help="print the resolved config only (like Hydra's --cfg job)"
    )
    _add_estimate(run)
    run.add_argument("--no-progress", action="store_true", help="no progress bar (log lines only)")
    run.add_argument(
        "-m",
        "--multirun",
        action="store_true",
        help="sweep: key=a,b,c expands to one run per combination (SLURM: one job array "
        "per resource shape; local: one run after another)",
    )
    run.add_argument(
        "--no-wait",
        action="store_true",
        help="start (locally: a detached launcher) or submit (SLURM), and return at once",
    )
    run.add_argument(
        "--timeout-min",
        type=positive_float,
        default=24 * 60,
        help="stop waiting (not the run) after this many minutes",
    )
    run.add_argument(
        "--after",
        action="append",
        default=[],
        metavar="DIR[:ok|:any]",
        help="start after the jobs of this run, sweep or study directory: once each completed (:ok, "
        "the default) or ended (:any); SLURM holds the job (--dependency), locally the command "
        "waits first. Repeatable (run.after in the config)",
    )


def _add_jobs(sub: Subparsers) -> None:
    st = sub.add_parser(
        "status", help="state of a run, sweep or study (local or SLURM), with progress and errors"
    )
    st.add_argument("path", type=Path, help="a run, sweep or study directory")
    st.add_argument(
        "--all", action="store_true", help="list every run of a large sweep (default: the first 50)"
    )
    lg = sub.add_parser("logs", help="print a rank's output (local or SLURM)")
    lg.add_argument("path", type=Path, help="a run directory")
    lg.add_argument("--rank", type=int, default=0)
    lg.add_argument("--follow", "-f", action="store_true", help="keep printing until the run ends")
    cn = sub.add_parser("cancel", help="cancel a run, or every run of a sweep or study (local or SLURM)")
    cn.add_argument("path", type=Path, help="a run, sweep or study directory")
    cn.add_argument(
        "--with-dependents",
        action="store_true",
        help="also cancel the jobs that wait on these (hpctrain run --after); asked when interactive",
    )


def _add_study(sub: Subparsers) -> None:
    sd = sub.add_parser(
        "study",
        help="strong/weak scaling study: expand, run (or resume), analyze",
        description="hpctrain study strong|weak [overrides] runs every point and writes a "
        "report; hpctrain study resume STUDY_DIR runs only the unfinished points.",
    )
    sd.add_argument("kind", choices=["strong", "weak", "resume"])
    _add_config_args(sd)
    sd.add_argument("--dry-run", action="store_true", help="list the runs; start nothing")
    _add_estimate(sd)
    sd.add_argument("--no-progress", action="store_true")
    sd.add_argument(
        "--analyze-as-job",
        "--no-wait",
        dest="analyze_as_job",
        action="store_true",
        help="submit the runs and, after them, the analysis as a job of its own (the report appears "
        "in the study directory without a waiting terminal); returns at once",
    )
    sd.add_argument(
        "--timeout-min",
        type=positive_float,
        default=24 * 60,
        help="stop waiting (not the runs) after this many minutes; `hpctrain study resume` goes on",
    )
    an = sub.add_parser(
        "analyze",
        help="analyze a study directory (table, CSV, plots, Markdown and HTML report), or a run's "
        "profiler traces (profile.enabled=true): the cross-rank trace summary",
    )
    an.add_argument(
        "path", type=Path, help="a study directory (with study.json), or a run directory with traces/"
    )
    an.add_argument("--out", help="report directory (default: STUDY_DIR/report)")


def _add_tune(sub: Subparsers) -> None:
    tu = sub.add_parser(
        "tune",
        help="find the fastest settings with short trials guided by the step model",
        description="Runs the config as given, then one setting at a time (the engine's fusion or "
        "buckets, compression, cycle; micro-batches; resharding), leaving out values the step model "
        "predicts clearly slower; prints what was tried and why, the best settings and their "
        "predicted throughput at tune.target_ranks, and writes them to <tune>/best.yaml. "
        "tune.budget_min, tune.keys and tune.target_ranks are overrides.",
    )
    _add_config_args(tu)
    tu.add_argument("--resume", type=Path, metavar="DIR", help="go on with an interrupted tune")
    tu.add_argument("--dry-run", action="store_true", help="list the settings and values; start nothing")
    tu.add_argument(
        "--timeout-min",
        type=positive_float,
        default=60,
        help="stop waiting for one trial after this many minutes",
    )


def _with_overrides_file(args: argparse.Namespace) -> None:
    """--overrides-file FILE: its overrides first, then the command line's."""
    path = getattr(args, "overrides_file", None)
    if path is None:
        return
    from hpctrain.config.override_file import overrides_file

    args.overrides = [*overrides_file(path), *args.overrides]


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = build_parser()
    # Overrides may stand before or after flags (argparse alone splits positionals at a flag).
    args, extra = parser.parse_known_args(argv)
    if extra and hasattr(args, "overrides") and not any(x.startswith("-") for x in extra):
        args.overrides = [*args.overrides, *extra]
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def dispatch(args: argparse.Namespace, console: Console) -> int:
    """The command's own module, imported only when it runs (so --help and status stay light)."""
    if args.command == "run":
        from hpctrain.commands.run import cmd_run

        return cmd_run(args, console)
    if args.command in ("study", "analyze"):
        from hpctrain.commands.study import cmd_analyze, cmd_study

        return (cmd_study if args.command == "study" else cmd_analyze)(args, console)
    if args.command == "tune":
        from hpctrain.commands.tune import cmd_tune

        return cmd_tune(args, console)
    if args.command in ("status", "logs", "cancel"):
        from hpctrain.commands import jobs

        if args.command == "status":
            return jobs.status(args.path, console, show_all=args.all)
        if args.command == "logs":
            return jobs.logs(args.path, args.rank, args.follow, console)
        return jobs.cancel(args.path, console, args.with_dependents)
    if args.command == "track":
        from hpctrain.commands.track import cmd_track

        return cmd_track(args, console)
    if args.command == "container":
        from hpctrain.commands.container import cmd_container

        return cmd_container(args, console)
    if args.command == "preflight":
        from hpctrain.commands.preflight import cmd_preflight

        return cmd_preflight(args, console)
    if args.command == "install":
        from hpctrain.commands.install import cmd_install

        return cmd_install(args, console)
    if args.command == "doctor":
        from hpctrain.commands.doctor import run_doctor

        return run_doctor(console)
    return _bench(args, console)


def _bench(args: argparse.Namespace, console: Console) -> int:
    if args.bench == "estimate":
        from hpctrain.bench.estimate import run_estimate_bench

        return run_estimate_bench(args, console)
    if args.bench == "overhead":
        from hpctrain.bench.overhead import run_overhead

        return run_overhead(args, console)
    if args.bench == "allreduce":
        from hpctrain.bench.allreduce import run_bench

        return run_bench(args, console)
    if args.bench == "analyze":
        from hpctrain.bench.analyze import run_bench as run_analyze_bench

        return run_analyze_bench(args, console)
    if args.bench == "memory":
        from hpctrain.bench.memory import run_memory_bench

        return run_memory_bench(args, console)
    if args.bench == "pipeline":
        from hpctrain.bench.pipeline import run_pipeline_bench

        return run_pipeline_bench(args, console)
    if args.bench == "profile":
        from hpctrain.bench.profile import run_profile_bench

        return run_profile_bench(args, console)
    if args.bench == "startup":
        from hpctrain.bench.startup import run_startup

        return run_startup(args, console)
    if args.bench == "tune":
        from hpctrain.bench.tune import run_tune_bench

        return run_tune_bench(args, console)
    if args.bench == "predict":
        from hpctrain.bench.predict import run_predict

        return run_predict(args, console)
    from hpctrain.bench.submit import run_submit

    return run_submit(args, console)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    records.keep_writes_private()
    console = make_console(sys.stdout)
    err = make_console(sys.stderr)
    # SIGTERM and SIGHUP stop a command like Ctrl-C does: what it started is stopped too
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.default_int_handler)
    try:
        _with_overrides_file(args)
        return dispatch(args, console)
    except HpctrainError as e:
        err.print(Text("error: ", style="bold red") + Text(str(e)), soft_wrap=True)
        return e.exit_code
    except KeyboardInterrupt:
        err.print("interrupted")
        return 130
    except BrokenPipeError:  # `hpctrain ... | head`
        return 0
    except OSError as e:  # the file system said no (a read-only --out, a full disk, ...)
        where = f": {e.filename}" if e.filename else ""
        err.print(Text("error: ", style="bold red") + Text(f"{e.strerror or e}{where}"), soft_wrap=True)
        return 1
    except Exception as e:  # noqa: BLE001 - a bug: one clear line instead of a traceback
        if os.environ.get("HPCTRAIN_DEBUG"):
            raise
        err.print(
            Text("error: ", style="bold red")
            + Text(
                f"unexpected {type(e).__name__}: {e}\n  this is a bug in hpctrain: rerun with "
                "HPCTRAIN_DEBUG=1 for the traceback, and please report it"
            ),
            soft_wrap=True,
        )
        return 1


if __name__ == "__main__":
    sys.exit(main())
