"""`hpctrain pull DIR`: the records, summary, report and plots of a run, sweep or study that lives on
a cluster behind SSH, fetched into its directory here (remote.json says where it is)."""

from __future__ import annotations

import argparse

from rich.console import Console

from hpctrain.errors import ConfigError, Problem
from hpctrain.remote.forward import recorded, target_of
from hpctrain.remote.there import Remote


def cmd_pull(args: argparse.Namespace, console: Console) -> int:
    found = recorded(args.path)
    if found is None:
        raise ConfigError(
            [
                Problem(
                    "path",
                    f"{args.path} is no record of a remote run (no remote.json in it or above it)",
                    "name a directory that a command with cluster.remote made here",
                )
            ]
        )
    local, ref = found
    Remote(target_of(ref), "", ref.hpctrain).pull(ref.remote_dir, local)
    console.print(f"pulled {ref.destination}:{ref.remote_dir} into {local}", highlight=False)
    return 0
