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
from collections.abc import Callable, Sequence

from rich.console import Console
from rich.text import Text

from hpctrain import records
from hpctrain.commands.ui import make_console
from hpctrain.errors import HpctrainError, PluginError
from hpctrain.parser import build_parser
from hpctrain.registry import load


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
    parser = build_parser(sys.argv[1:] if argv is None else argv)
    # Overrides may stand before or after flags (argparse alone splits positionals at a flag).
    args, extra = parser.parse_known_args(argv)
    if extra and hasattr(args, "overrides") and not any(x.startswith("-") for x in extra):
        args.overrides = [*args.overrides, *extra]
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def dispatch(args: argparse.Namespace, console: Console) -> int:
    """The command's handler, which its parser declared ("module:function"; parser.py), imported
    only when it runs (so --help and status stay light)."""
    # "module:function", or "module:Class.method" (installed commands)
    handler: Callable[[argparse.Namespace, Console], int] = load(args.handler)
    plugin = getattr(args, "plugin", None)  # another package's command: its failure is its own
    try:
        return int(handler(args, console))
    except (HpctrainError, KeyboardInterrupt, BrokenPipeError):
        raise
    except Exception as e:  # noqa: BLE001 - named as that package's, with its traceback on request
        if plugin is None or os.environ.get("HPCTRAIN_DEBUG"):
            raise  # hpctrain's own: main() names it as a bug
        raise PluginError(
            f"{plugin}, from another installed package, failed: {type(e).__name__}: {e}\n"
            "  report it to that package's authors (HPCTRAIN_DEBUG=1 shows the traceback)"
        ) from None


def _remote(args: argparse.Namespace, argv: Sequence[str]) -> int | None:
    """The command's exit status where it ran on a cluster behind SSH (cluster.remote, or a
    directory whose remote.json says it lives there); None where it runs here. Only commands
    that plan or follow work can go there: the others never import the remote package."""
    from hpctrain.remote import ON_RECORDS, PLANNED

    if args.command not in PLANNED and args.command not in ON_RECORDS:
        return None
    from hpctrain.remote.forward import maybe_forward

    return maybe_forward(args, argv)


def main(argv: Sequence[str] | None = None) -> int:
    code = _main(argv)
    return _unwaited(code) if argv is None else code


def _main(argv: Sequence[str] | None) -> int:
    err = make_console(sys.stderr)
    try:
        args = parse(argv)
    except PluginError as e:  # the command named is another package's, and it cannot be loaded
        err.print(Text("error: ", style="bold red") + Text(str(e)), soft_wrap=True)
        return e.exit_code
    records.keep_writes_private()
    console = make_console(sys.stdout)
    # SIGTERM and SIGHUP stop a command like Ctrl-C does: what it started is stopped too
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.default_int_handler)
    try:
        _with_overrides_file(args)
        forwarded = _remote(args, sys.argv[1:] if argv is None else argv)
        return forwarded if forwarded is not None else dispatch(args, console)
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


def _unwaited(code: int) -> int:
    """The program's end (argv from sys.argv): a thread that code hpctrain imported (a model's
    constructor, traced for its memory) started and never ended would keep the finished command
    alive in silence; it is named, and not waited for."""
    import threading

    left = [
        t for t in threading.enumerate() if t is not threading.main_thread() and t.is_alive() and not t.daemon
    ]
    if left:
        names = ", ".join(t.name for t in left[:3])
        print(
            f"hpctrain: note: not waiting for {len(left)} thread(s) that code it ran (a _target_, a plugin) started and left running ({names})",
            file=sys.stderr,
        )
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
