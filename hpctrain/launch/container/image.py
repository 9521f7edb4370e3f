"""The Charliecloud image build, step by step (see build.py for what goes in and why): each step
is skipped when its cached product exists, and one lock per storage keeps two builds (CI's
background build and a test waiting for it) from racing."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from hpctrain.errors import LaunchError
from hpctrain.launch.container.build import (
    CONTEXT_FILES,
    ROOT,
    Inputs,
    Say,
    ch_env,
    empty_special_files,
    gather_inputs,
    images,
    render_dockerfile,
    run,
    tree_digest,
    wheelhouse,
)
from hpctrain.launch.container.store import RECORD, cache_dir, image_dir, read_record


@dataclass(frozen=True)
class Built:
    name: str
    directory: Path
    digest: str
    key: str
    seconds: float
    cached: bool


# ch-image's build cache keeps an image as a git worktree and commits whatever its tree holds
# after each step, our record included; rewriting the record then leaves the worktree dirty, and
# the build after next fails in `git checkout` ("local changes would be overwritten"). The cache
# could only ever hit FROM here (the context holds the sources), so the image is built without it.
NO_CACHE = "--no-cache"


@contextmanager
def storage_lock(storage: Path) -> Iterator[None]:
    """Beside the storage, not in it: ch-image refuses a storage directory holding other files."""
    storage.parent.mkdir(parents=True, exist_ok=True)
    with storage.with_name(storage.name + ".lock").open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def build_image(name: str, storage: Path, say: Say, force: bool = False) -> Built:
    """Build (or find) the image `name` in `storage` for this machine's venv."""
    t0 = time.monotonic()
    inputs = gather_inputs()
    with storage_lock(storage):
        root = image_dir(storage, name)
        rec = read_record(root)
        if rec and rec.get("key") == inputs.key() and not force:
            return Built(name, root, rec["digest"], rec["key"], time.monotonic() - t0, True)
        log = cache_dir() / "container-build.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text("")
        say(f"building {name} (log: {log})")
        base = base_image(inputs, storage, say, log)
        wheels = wheelhouse(inputs, say, log)
        with tempfile.TemporaryDirectory(prefix="hpctrain-image.") as tmp:
            ctx = make_context(Path(tmp), inputs, wheels)
            dockerfile = ctx / "Dockerfile"
            dockerfile.write_text(render_dockerfile(inputs.dockerfile, base))
            say("installing hpctrain into the image with scripts/setup.sh (offline, from the wheels)")
            run(
                [
                    "ch-image",
                    "-s",
                    str(storage),
                    "build",
                    NO_CACHE,
                    "--force",
                    "-t",
                    name,
                    "-f",
                    str(dockerfile),
                    str(ctx),
                ],
                log,
                ch_env(),
            )
        say("hashing the image")
        digest = tree_digest(root)
        record = {
            "name": name,
            "key": inputs.key(),
            "digest": digest,
            "built": time.time(),
            "pins": list(inputs.pins),
            "horovod_wheel": inputs.horovod_wheel,
            "packages": list(inputs.packages),
            "suite": inputs.suite,
        }
        (root / RECORD).parent.mkdir(parents=True, exist_ok=True)
        (root / RECORD).write_text(json.dumps(record, indent=1))
        return Built(name, root, digest, inputs.key(), time.monotonic() - t0, False)


def base_image(inputs: Inputs, storage: Path, say: Say, log: Path) -> str:
    """Debian 12 from Debian's packages, imported into ch-image storage once per package set."""
    tag = f"hpctrain-base:{inputs.base_key()}"
    if image_dir(storage, tag).name in images(storage):
        return tag
    if os.geteuid() != 0:
        raise LaunchError(
            "debootstrap needs root to make the base image: run hpctrain container build as root "
            "once (the image then runs unprivileged)"
        )
    debs = cache_dir() / "debootstrap"
    debs.mkdir(parents=True, exist_ok=True)
    rootfs = Path(tempfile.mkdtemp(prefix="rootfs.", dir=storage.parent))  # same file system
    try:
        say(f"base: debootstrap {inputs.suite} with {', '.join(inputs.packages)}")
        run(
            [
                "debootstrap",
                "--variant=minbase",
                f"--include={','.join(inputs.packages)}",
                f"--cache-dir={debs}",
                inputs.suite,
                str(rootfs),
                inputs.mirror,
            ],
            log,
        )
        removed = empty_special_files(rootfs)
        say(f"base: {len(removed)} device files and /dev entries removed before the import")
        run(["ch-image", "-s", str(storage), "import", str(rootfs), tag], log, ch_env())
    finally:
        shutil.rmtree(rootfs, ignore_errors=True)
    return tag


def make_context(ctx: Path, inputs: Inputs, wheels: Path) -> Path:
    """The build context: hpctrain's sources, the wheels, the Horovod wheel where setup.sh looks."""
    for rel in CONTEXT_FILES:
        src, dst = ROOT / rel, ctx / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(src, dst)
    _link_tree(wheels, ctx / ".build" / "wheels")
    wheel = cache_dir() / "wheels" / inputs.horovod_wheel
    _link_tree(wheel.parent, ctx / ".build" / "cache" / "wheels" / wheel.parent.name)
    return ctx


def _link_tree(src: Path, dst: Path) -> None:
    """Hard links where the file system allows (no copy of a GB of wheels), copies elsewhere."""
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        try:
            os.link(f, dst / f.name)
        except OSError:
            shutil.copy2(f, dst / f.name)
