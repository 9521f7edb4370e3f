"""The `hpctrain` command. Library code raises typed errors; this module turns them into messages
and exit codes (0 ok, 1 other error, 2 invalid config, 3 launch error, 4 a rank failed, 130 ^C)."""
from __future__ import annotations

import argparse
import sys
from datetime import datetime
from pathlib import Path
from typing import Sequence

from rich.console import Console
from rich.text import Text

from .errors import HpctrainError

EPILOG = """examples:
  hpctrain run                                   2-rank local run of the default CNN
  hpctrain run cluster.ranks=4 precision=bf16    Hydra overrides: key=value, group=option
  hpctrain run model=transformer data=tokens --dry-run
  hpctrain doctor                                what this environment can do
  hpctrain bench overhead                        hpctrain vs a hand-written Horovod script
"""


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                   help="Hydra overrides, e.g. model=resnet18 train.steps=100 cluster.ranks=4")
    p.add_argument("--config-dir", help="directory with config.yaml (default: hpctrain's conf/)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hpctrain", description="Distributed Horovod training from Hydra configs, locally "
        "with mpirun or on SLURM, with scaling analysis.", epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    from . import __version__

    parser.add_argument("--version", action="version", version=f"hpctrain {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="train with the given config overrides",
                         description="Compose the config, validate it, plan the launch and run it.")
    _add_config_args(run)
    run.add_argument("--dry-run", action="store_true",
                     help="print the resolved config and the exact launch command; start nothing")
    run.add_argument("--cfg", action="store_true", help="print the resolved config only (like Hydra's --cfg job)")
    run.add_argument("--no-progress", action="store_true", help="no progress bar (log lines only)")

    sub.add_parser("doctor", help="report what this environment can do, and how to fix what is missing")

    bench = sub.add_parser("bench", help="benchmarks that print ratios measured in one run")
    bsub = bench.add_subparsers(dest="bench", required=True, metavar="BENCH")
    ov = bsub.add_parser("overhead", help="hpctrain's training throughput vs a minimal Horovod script")
    ov.add_argument("--ranks", type=int, default=2)
    ov.add_argument("--repeats", type=int, default=3, help="interleaved runs of each (default 3)")
    ov.add_argument("--steps", type=int, default=60)
    ov.add_argument("--batch", type=int, default=64, help="per-rank batch")
    ov.add_argument("--out", default="outputs/bench", help="where the runs' directories go")
    return parser


def cmd_run(args: argparse.Namespace, console: Console) -> int:
    from .config import load_config, to_yaml, validate
    from .facts import HostFacts
    from .launch.local import GlooRendezvous, prepare_run_dir, run_local, write_run_files
    from .plan import GLOO_HOST, default_run_dir, plan_local
    from .ui import TrainingProgress, summary_table

    cfg = load_config(args.overrides, args.config_dir)
    if args.cfg:
        print(to_yaml(cfg), end="")
        return 0
    facts = HostFacts.gather()
    validate(cfg, facts)
    run_dir = default_run_dir(cfg, datetime.now()).resolve()
    if args.dry_run:
        plan = plan_local(cfg, facts, str(run_dir), sys.executable)
        print("# resolved config\n" + to_yaml(cfg))
        print(f"# run directory\n{plan.run_dir}\n")
        for note in plan.notes:
            print(f"# note: {note}")
        print(f"# launch command\n{plan.command_line}")
        return 0
    prepare_run_dir(run_dir)
    rendezvous = GlooRendezvous(GLOO_HOST, plan_ranks(cfg)) if cfg.parallelism.backend == "gloo" else None
    try:
        plan = plan_local(cfg, facts, str(run_dir), sys.executable,
                          rendezvous.port if rendezvous else None)
        write_run_files(run_dir, cfg, plan)
        console.print(f"[bold]run directory[/] {run_dir}")
        for note in plan.notes:
            console.print(f"[yellow]note:[/] {note}")
        with TrainingProgress(console, cfg.train.steps, enabled=not args.no_progress) as bar:
            summary = run_local(plan, lambda line: bar.print(line.text), bar.on_event)
    finally:
        if rendezvous:
            rendezvous.close()
    console.print(summary_table(summary))
    console.print(f"records: {run_dir}")
    return 0


def plan_ranks(cfg) -> int:  # noqa: ANN001
    from .config.validate import world_size

    return world_size(cfg)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    console = Console(stderr=False)
    err = Console(stderr=True)
    try:
        if args.command == "run":
            return cmd_run(args, console)
        if args.command == "doctor":
            from .doctor import run_doctor

            return run_doctor(console)
        if args.command == "bench" and args.bench == "overhead":
            from .bench.overhead import run_overhead

            return run_overhead(args, console)
    except HpctrainError as e:
        err.print(Text("error: ", style="bold red") + Text(str(e)), soft_wrap=True)
        return e.exit_code
    except KeyboardInterrupt:
        err.print("interrupted")
        return 130
    return 1


if __name__ == "__main__":
    sys.exit(main())
