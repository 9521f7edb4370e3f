"""Every command's arguments: the `hpctrain` parser (cli.py parses with it and dispatches; the
documentation's command-line reference is generated from it, hpctrain/docgen/cli_ref.py)."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, cast

from hpctrain.argtypes import positive_float
from hpctrain.bench.args import add_bench
from hpctrain.errors import PluginError

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


class Parser(argparse.ArgumentParser):
    """A command's parser; one that takes config overrides lists the config groups and their
    options in its --help, as a Hydra app does (read only then: status and logs stay light)."""

    lists_groups = False

    def format_help(self) -> str:
        if self.lists_groups and not self.epilog:
            self.epilog = config_groups_help()
            self.formatter_class = argparse.RawDescriptionHelpFormatter
        return super().format_help()


def config_groups_help(env: Mapping[str, str] = os.environ) -> str:
    """The config groups and their options, from every directory on the search path."""
    from hpctrain.config.search import search_path
    from hpctrain.errors import ConfigError

    note = ""
    try:
        found = search_path(None, env)
    except ConfigError as e:  # a bad $HPCTRAIN_CONFIG_PATH: the shipped groups, and why
        found = search_path(None, {})
        note = f"\n(only hpctrain's own: {e.problems[0].key}: {e.problems[0].rule})"
    lines = [
        "config groups (choose with group=option; every key: hpctrain run --cfg, or the docs'",
        "configuration reference):",
    ]
    for group in sorted(found.groups()):
        opts = found.options(group)
        if opts:
            lines.append(f"  {group + ':':<13}{', '.join(opts)}")
    where = ", ".join(f"{s.path} ({s.origin})" for s in found.sources)
    return "\n".join(lines) + f"\nread from: {where}{note}"


def _add_config_args(p: argparse.ArgumentParser) -> None:
    if isinstance(p, Parser):
        p.lists_groups = True
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


def _add_track(sub: Subparsers) -> None:
    tr = sub.add_parser(
        "track",
        help="send a run, sweep or study to MLflow / TensorBoard from its records (again: never twice)",
        description="Logs what is new of a run, sweep or study directory: where its config's "
        "tracking.* says, else to MLflow's default store (sqlite:///<run.output_root>/mlflow.db). "
        "Runs of an offline cluster are sent later from a login node this way.",
    )
    tr.set_defaults(handler="hpctrain.commands.track:cmd_track")
    tr.add_argument("path", type=Path, help="a run, sweep or study directory")
    tr.add_argument("--uri", help="an MLflow tracking URI (a server, or sqlite:///path.db)")
    tr.add_argument("--tensorboard", action="store_true", help="also write TensorBoard event files")


def _add_pull(sub: Subparsers) -> None:
    pl = sub.add_parser(
        "pull",
        help="fetch a remote run's, sweep's or study's records and report (cluster.remote)",
        description="Copies the records, summary, report and plots of a run, sweep or study that lives "
        "on a cluster behind SSH into its directory here (its remote.json says where it lives); never "
        "the code snapshot, pickles or weights.",
    )
    pl.set_defaults(handler="hpctrain.commands.pull:cmd_pull")
    pl.add_argument("path", type=Path, help="the run, sweep or study directory here")


def _add_doctor(sub: Subparsers) -> None:
    doc = sub.add_parser("doctor", help="report what this environment can do, and how to fix what is missing")
    doc.add_argument(
        "--json",
        action="store_true",
        help="print the checks as JSON (name, ok, detail, fix, required), for scripts and tests",
    )
    doc.set_defaults(handler="hpctrain.commands.doctor:cmd_doctor")


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """hpctrain's parser: its own commands, and (given the command line `argv` that names none of
    them: another's, or --help) those other installed packages add through entry points in
    `hpctrain.commands`; hpctrain's own commands never pay for the search."""
    parser = Parser(
        prog="hpctrain",
        description="Distributed PyTorch training from Hydra configs, on this machine (mpirun, or\n"
        "processes started as torchrun does) or on SLURM (submitit), with Horovod or torch DDP and\n"
        "data, pipeline, hybrid, FSDP/HSDP and tensor-parallel layouts; records where every step's\n"
        "time goes and reports how well training scales.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    from hpctrain import __version__

    parser.add_argument("--version", action="version", version=f"hpctrain {__version__}")
    # every command's parser is a Parser (its --help lists the config groups where it takes them);
    # the helpers that add commands need only what any ArgumentParser has
    sub = cast(
        "Subparsers",
        parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=Parser),
    )
    _add_run(sub)
    _add_jobs(sub)
    _add_study(sub)
    _add_tune(sub)
    _add_track(sub)
    _add_doctor(sub)
    _add_pull(sub)
    ins = sub.add_parser(
        "install",
        help="build and install Horovod for this environment (no root; cached per user)",
        description="horovod: Horovod 0.28.1 built from its source release for this environment's torch "
        "and Python, with the MPI (mpicxx) and CUDA (nvcc) found on PATH (load them first: module load "
        "openmpi cuda), patched for PyTorch 2 and Python 3.12; cached in ~/.cache/hpctrain/wheels, so "
        "another environment with the same torch and Python installs it in seconds.",
    )
    ins.set_defaults(handler="hpctrain.commands.install:cmd_install")
    ins.add_argument("what", choices=["horovod"], help="what to install")
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
    pf.set_defaults(handler="hpctrain.commands.preflight:cmd_preflight")
    _add_config_args(pf)
    pf.add_argument("--dry-run", action="store_true", help="print the plan; start nothing")
    pf.add_argument(
        "--timeout-min", type=positive_float, default=60, help="stop waiting after this many minutes"
    )
    _add_container(sub)
    add_bench(sub)
    if argv is not None:
        add_installed_commands(sub, next((a for a in argv if not a.startswith("-")), None))
    return parser


def add_installed_commands(sub: Subparsers, chosen: str | None) -> None:
    """The commands other installed packages register, as pytest's and Hydra's plugins are found:

        [project.entry-points."hpctrain.commands"]
        hello = "my_package.cli:Hello"

    `Hello` has `help` (a line for the command list), `add_arguments(parser)` and
    `run(args, console) -> int` (the exit code). Only the `chosen` command (the command line's
    first word) is imported, bounded (registry.load_installed): --help, --version and hpctrain's own
    commands import none, and list the others by name and package. One that cannot be loaded is a
    PluginError naming it; one that takes a name of hpctrain's own is left out."""
    if chosen in sub.choices:
        return  # one of hpctrain's own: no search
    import importlib.metadata

    for ep in importlib.metadata.entry_points(group="hpctrain.commands"):
        if ep.name in sub.choices:
            continue
        if ep.name != chosen:
            dist = f"{ep.dist.name} {ep.dist.version}" if ep.dist else ep.value
            sub.add_parser(ep.name, help=f"a command of {dist} (not loaded until run)")
            continue
        from hpctrain.registry import load_installed

        command = load_installed(ep.value, f"the command {ep.name!r}")
        said = str(getattr(command, "help", ""))
        p = sub.add_parser(ep.name, help=said, description=said or None)
        try:
            with contextlib.redirect_stdout(sys.stderr):
                command.add_arguments(p)
        except Exception as e:  # noqa: BLE001 - another package's bug, named as its own
            raise PluginError(
                f"the command {ep.name!r} ({ep.value}, from another installed package) failed to add "
                f"its arguments: {type(e).__name__}: {e}"
            ) from None
        p.set_defaults(handler=f"{ep.value}.run", plugin=f"the command {ep.name!r} ({ep.value})")


def _add_container(sub: Subparsers) -> None:
    ct = sub.add_parser(
        "container",
        help="build the training image with Charliecloud (cluster.container.runtime=charliecloud)",
        description="build: a Debian 12 image from debootstrap, with this machine's wheels (torch, "
        "mpi4py, Horovod, every dependency at the venv's versions) installed by scripts/setup.sh, "
        "offline; cached by what went into it. show: the digest of a built image.",
    )
    ct.set_defaults(handler="hpctrain.commands.container:cmd_container")
    ct.add_argument("action", choices=["build", "show"], help="build the image, or show a built one's digest")
    ct.add_argument("--tag", default="hpctrain", help="image name in ch-image storage (default: hpctrain)")
    ct.add_argument("--storage", help="ch-image storage directory (default: ~/.cache/hpctrain/charliecloud)")
    ct.add_argument("--force", action="store_true", help="build again even if the cached image is current")


def _add_run(sub: Subparsers) -> None:
    run = sub.add_parser(
        "run",
        help="train with the given config overrides",
        description="Compose the config, validate it, plan the launch and run it.",
    )
    run.set_defaults(handler="hpctrain.commands.run:cmd_run")
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
    st.set_defaults(handler="hpctrain.commands.jobs:cmd_status")
    st.add_argument("path", type=Path, help="a run, sweep or study directory")
    st.add_argument(
        "--all", action="store_true", help="list every run of a large sweep (default: the first 50)"
    )
    lg = sub.add_parser("logs", help="print a rank's output (local or SLURM)")
    lg.set_defaults(handler="hpctrain.commands.jobs:cmd_logs")
    lg.add_argument("path", type=Path, help="a run directory")
    lg.add_argument("--rank", type=int, default=0, help="which rank's output (default 0)")
    lg.add_argument("--follow", "-f", action="store_true", help="keep printing until the run ends")
    cn = sub.add_parser("cancel", help="cancel a run, or every run of a sweep or study (local or SLURM)")
    cn.set_defaults(handler="hpctrain.commands.jobs:cmd_cancel")
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
    sd.set_defaults(handler="hpctrain.commands.study:cmd_study")
    sd.add_argument(
        "kind",
        choices=["strong", "weak", "resume"],
        help="strong: the global batch fixed; weak: the batch per rank fixed; resume STUDY_DIR: "
        "run only its unfinished points",
    )
    _add_config_args(sd)
    sd.add_argument("--dry-run", action="store_true", help="list the runs; start nothing")
    _add_estimate(sd)
    sd.add_argument("--no-progress", action="store_true", help="no progress bar (log lines only)")
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
    an.set_defaults(handler="hpctrain.commands.study:cmd_analyze")
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
    tu.set_defaults(handler="hpctrain.commands.tune:cmd_tune")
    _add_config_args(tu)
    tu.add_argument("--resume", type=Path, metavar="DIR", help="go on with an interrupted tune")
    tu.add_argument("--dry-run", action="store_true", help="list the settings and values; start nothing")
    tu.add_argument(
        "--timeout-min",
        type=positive_float,
        default=60,
        help="stop waiting for one trial after this many minutes",
    )
