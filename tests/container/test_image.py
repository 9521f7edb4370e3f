"""The base image's import is bounded: a root file system whose /dev holds device nodes (what
debootstrap leaves) would be copied by `ch-image import` as data, /dev/full until the disk is
full. Shown on a 16 MiB tmpfs this test mounts: the raw tree fills it; the tree hpctrain prepares
(empty_special_files) imports in a few hundred KiB."""

from __future__ import annotations

import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpctrain.launch.container.build import ch_env, empty_special_files
from tests.conftest import small_tmpfs

pytestmark = pytest.mark.container


def tiny_rootfs(root: Path, fifo: bool = True) -> Path:
    for d in ("bin", "etc", "dev/pts", "tmp"):
        (root / d).mkdir(parents=True)
    (root / "etc" / "hostname").write_text("image\n")
    (root / "bin" / "sh").write_bytes(b"\x7fELF" + b"\0" * 4096)
    os.mknod(root / "dev" / "full", 0o666 | stat.S_IFCHR, os.makedev(1, 7))
    os.mknod(root / "dev" / "zero", 0o666 | stat.S_IFCHR, os.makedev(1, 5))
    if fifo:
        os.mkfifo(root / "tmp" / "fifo")
    (root / "dev" / "fd").symlink_to("/proc/self/fd")
    return root


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    with small_tmpfs(tmp_path / "disk", "16m") as mnt:
        yield mnt


def ch_import(rootfs: Path, storage: Path, name: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["ch-image", "-s", str(storage), "import", str(rootfs), name],
        capture_output=True,
        text=True,
        env=ch_env(),
        timeout=300,
    )


def test_the_import_is_bounded_once_device_files_are_gone(tmp_path: Path, small_disk: Path) -> None:
    raw = tiny_rootfs(tmp_path / "raw", fifo=False)
    r = ch_import(raw, small_disk / "raw-storage", "raw")
    assert r.returncode != 0 and "No space left" in r.stdout + r.stderr, r.stdout + r.stderr  # the trap
    subprocess.run(["rm", "-rf", str(small_disk / "raw-storage")], check=True)

    prepared = tiny_rootfs(tmp_path / "prepared")
    removed = empty_special_files(prepared)
    assert sorted(removed) == ["dev/fd", "dev/full", "dev/pts", "dev/zero", "tmp/fifo"]
    r = ch_import(prepared, small_disk / "storage", "tiny")
    assert r.returncode == 0, r.stdout + r.stderr
    used = sum(f.stat().st_size for f in (small_disk / "storage").rglob("*") if f.is_file())
    assert used < 1 << 20, used
    assert (small_disk / "storage" / "img" / "tiny" / "etc" / "hostname").read_text() == "image\n"
