"""The `hpctrain` command. Library code raises typed errors; this module turns them into messages
and exit codes (0 ok, 1 other error or an unreadable record, 2 invalid config or arguments,
3 launch error, 4 a rank failed, 130 interrupted or cancelled). Nothing ends in a traceback: an
unexpected exception is one line that says it is a bug (HPCTRAIN_DEBUG=1 shows the traceback).
The arguments of every command: parser.py."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Sequence

from rich.console import Console
from rich.text import Text

from hpctrain import records
from hpctrain.commands.ui import make_console
from hpctrain.errors import HpctrainError
from hpctrain.parser import build_parser


def _with_overrides_file(args: argparse.Namespace) -> None:
    """--overrides-file FILE: its overrides first, then the command line's (which may override
    them; within the command line, or within the file, a key is given once)."""
    if getattr(args, "overrides", None) and not (args.command == "study" and args.kind == "resume"):
        from hpctrain.config.overrides import chosen_twice

        for note in chosen_twice(args.overrides, "on the command line"):
            print(f"hpctrain: note: {note}", file=sys.stderr)
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
