"""A command typed here, run by the cluster's hpctrain (`cluster.remote`): its versions compared
first, the code and configs sent once per content (bundle.py), the command line sent as data (a
script on ssh's standard input, every word quoted: nothing of it reaches the login shell), its
output and exit status passed through unchanged (a refusal is exit 2 here as there). A run, sweep
or study gets a directory here too, with `remote.json` naming where it lives; `status`, `logs`,
`cancel`, `analyze` and `pull` on that directory go to the cluster, and its records, summary and
report come back when a waited-for command ends or on `hpctrain pull`."""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

from hpctrain import __version__, records
from hpctrain.errors import ConfigError, Problem
from hpctrain.facts import cache_dir
from hpctrain.remote import ON_RECORDS, PLANNED
from hpctrain.remote.bundle import CONF
from hpctrain.remote.ssh import Target, control_dir
from hpctrain.remote.there import Remote


def target(destination: str, ssh_config: str | None) -> Target:
    return Target(destination, ssh_config, control_dir(cache_dir()))


def target_of(ref: records.RemoteRef) -> Target:
    return target(ref.destination, ref.ssh_config)


def path_there(path: Path, local: Path, ref: records.RemoteRef) -> str:
    """The path there of `path`, a directory inside `local`, the record of `ref`'s directory."""
    inside = path.resolve().relative_to(local.resolve()).as_posix()
    return f"{ref.remote_dir}/{inside}".removesuffix("/.")


def maybe_forward(args: argparse.Namespace, argv: Sequence[str]) -> int | None:
    """The command's exit status where it went to the cluster; None where it runs here."""
    if args.command in PLANNED and not getattr(args, "cfg", False):
        return _planned(args, list(argv))
    if args.command in ON_RECORDS:
        found = recorded(Path(args.path))
        if found is not None:
            return _on_records(args, list(argv), *found)
    return None


def recorded(path: Path) -> tuple[Path, records.RemoteRef] | None:
    """The local record of a remote run, sweep or study that `path` is (or is inside)."""
    for d in [path, *path.resolve().parents]:
        if (d / records.REMOTE).is_file():
            return d, records.read(d / records.REMOTE, records.RemoteRef)
    return None


def _planned(args: argparse.Namespace, argv: list[str]) -> int | None:
    if args.command == "study" and args.kind == "resume":
        found = recorded(Path(args.overrides[0])) if args.overrides else None
        return None if found is None else _on_records(args, argv, *found)
    from hpctrain.config.derived import default_run_dir
    from hpctrain.config.load import load_config
    from hpctrain.orchestrate.sweep import expand
    from hpctrain.remote.bundle import build, members

    overrides = list(args.overrides)
    if not may_be_remote(overrides):
        return None
    first = expand(overrides, args.config_dir)[0] if getattr(args, "multirun", False) else overrides
    study = [f"study={args.kind}"] if args.command == "study" else []  # as the study composes it
    try:
        cfg = load_config([*first, *study], args.config_dir)
    except ConfigError:
        return None  # the command itself refuses it, as it would anyway
    destination = getattr(cfg.cluster, "remote", None)
    if not destination:
        return None
    there = Remote(
        target(destination, cfg.cluster.remote_ssh_config),
        cfg.cluster.remote_dir,
        cfg.cluster.remote_hpctrain,
    )
    there.check_version()
    home = there.send(build(members(Path(cfg.code.dir or "."), list(cfg.code.include), args.config_dir)))
    dry = bool(
        getattr(args, "dry_run", False)
        or getattr(args, "estimate", False)
        or getattr(args, "estimate_from", None)
    )
    stem = default_run_dir(cfg, datetime.now())  # run.dir, or the dated default
    remote_stem = f"{there.root}/runs/{stem.parent.name}/{stem.name}"
    suffix = f"-{args.kind}" if args.command == "study" else ""  # a study's directory has its kind after it
    local, remote_dir = stem.with_name(stem.name + suffix), remote_stem + suffix
    words = _rewritten(argv, PLANNED[args.command], overrides)
    words += [
        "cluster.remote=null",
        f"run.dir={hydra_quoted(remote_stem)}",
        'code.include=["**/*"]',
        "--config-dir",
        f"{home}/{CONF}",
    ]
    if dry:
        return there.run(f"{home}/code", words)
    refused = there.check(f"{home}/code", words)
    if refused is not None:
        return refused
    ref = records.new(
        records.RemoteRef,
        destination=destination,
        ssh_config=cfg.cluster.remote_ssh_config,
        remote_dir=remote_dir,
        hpctrain=there.hpctrain,
        version=__version__,
    )
    local.mkdir(parents=True, exist_ok=False)
    records.write(local / records.REMOTE, ref)
    print(f"remote: {destination}:{remote_dir} (this machine's record: {local})", flush=True)
    code = there.run(f"{home}/code", words, follow_up=f"hpctrain status {local}")
    if not getattr(args, "no_wait", False):
        there.pull(remote_dir, local)
    return code


def hydra_quoted(value: str) -> str:
    """A string as one quoted value of Hydra's override grammar (a run name's characters in a path)."""
    # Hydra's quoted strings: a quote is escaped by a backslash, and only backslashes before a
    # quote (or the closing one) are escapes themselves
    inner = re.sub(r"(\\*)'", lambda m: m.group(1) * 2 + "\\'", value)
    return "'" + re.sub(r"(\\+)$", lambda m: m.group(1) * 2, inner) + "'"


# only a site preset (a cluster option hpctrain does not ship) or the key itself can make a
# command remote: the others are not composed twice
SHIPPED_CLUSTERS = ("local", "slurm")
MAYBE_REMOTE = re.compile(r"^[+~]*cluster(=|\.remote=)")


def may_be_remote(overrides: Sequence[str]) -> bool:
    """Could these overrides make the command run on a remote cluster?"""
    for o in overrides:
        m = MAYBE_REMOTE.match(o)
        if m and (m.group(1) != "=" or o.split("=", 1)[1] not in SHIPPED_CLUSTERS):
            return True
    return False


def _rewritten(argv: list[str], words: int, overrides: list[str]) -> list[str]:
    """The command line as the cluster's hpctrain takes it: the overrides file's content (read
    here) and the command line's overrides, in that order, after the command's words; this
    machine's --config-dir and --overrides-file dropped (their content travels)."""
    out, skip = [], False
    for i, a in enumerate(argv):
        if skip:
            skip = False
            continue
        if a in ("--config-dir", "--overrides-file"):
            skip = True
            continue
        if a.startswith(("--config-dir=", "--overrides-file=")) or (i >= words and a in overrides):
            continue
        out.append(a)
    rest = out[words:]
    rest = [_there(a) if i and rest[i - 1] in PATH_FLAGS else a for i, a in enumerate(rest)]
    return [*out[:words], *overrides, *rest]


PATH_FLAGS = ("--after", "--resume", "--from")  # flags whose value names a directory of runs


def _there(word: str) -> str:
    """A word naming a directory that lives there (--after DIR[:any], --resume DIR): its path there."""
    path, sep, how = word.rpartition(":") if word.endswith((":ok", ":any")) else (word, "", "")
    found = recorded(Path(path)) if path and not path.startswith("-") else None
    return word if found is None else path_there(Path(path), *found) + sep + how


def _on_records(args: argparse.Namespace, argv: list[str], local: Path, ref: records.RemoteRef) -> int:
    """status, logs, cancel, analyze or study resume of a remote directory: the same command
    there, on its remote path (and what it wrote comes back)."""
    if getattr(args, "out", None):
        raise ConfigError(
            [
                Problem(
                    "--out",
                    f"{local} lives on {ref.destination}: its report is written there, into its report/",
                    "drop --out: the report comes back into the study's report/ here",
                )
            ]
        )
    given = Path(args.overrides[0] if args.command == "study" else args.path)
    there = Remote(target_of(ref), "", ref.hpctrain)
    remote_path = path_there(given, local, ref)
    words = [remote_path if a == str(given) or Path(a) == given else a for a in argv]
    code = there.run(".", words)
    if args.command in ("analyze", "study") or (args.command == "status" and code == 0):
        there.pull(ref.remote_dir, local)
    return code
