"""`hpctrain container build | show`: the training image for cluster.container.runtime=charliecloud,
built here from Debian's packages and this machine's wheels, and what hpctrain knows of it."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from hpctrain.errors import HpctrainError
from hpctrain.launch.container.store import default_storage, image_dir, read_record


def cmd_container(args: argparse.Namespace, console: Console) -> int:
    storage = Path(args.storage) if args.storage else default_storage()
    if args.action == "show":
        rec = read_record(image_dir(storage, args.tag))
        if rec is None:
            raise HpctrainError(
                f"no image {args.tag!r} built by hpctrain in {storage}: hpctrain container build"
            )
        console.print(
            f"{args.tag}: {rec['digest']} (key {rec['key']}, {len(rec['pins'])} pinned distributions)"
        )
        return 0
    from hpctrain.launch.container.image import build_image

    built = build_image(
        args.tag,
        storage,
        lambda text: console.print(f"[bold]container[/] {text}", highlight=False),
        force=args.force,
    )
    how = "found (cached)" if built.cached else "built"
    console.print(f"{how}: {built.name} in {built.seconds:.0f} s, {built.digest}", highlight=False)
    opts = "" if built.name == "hpctrain" else f" cluster.container.image={built.name}"
    store = "" if args.storage is None else f" cluster.container.storage={storage}"
    console.print(
        f"use it: hpctrain run cluster.container.runtime=charliecloud{opts}{store}", highlight=False
    )
    return 0
