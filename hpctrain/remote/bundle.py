"""What travels to the cluster with a command: the code snapshot (the same files a SLURM job's
snapshot takes: git-tracked, or code.include) under `code/`, and the config directories this
machine adds to hpctrain's search path (--config-dir, $HPCTRAIN_CONFIG_PATH, ~/.config/hpctrain:
the site preset that names the cluster) merged under `conf/`. One tar archive, built the same way
from the same files (sorted, no times, no owners), so its sha256 names its content: the cluster
keeps one copy per hash, and a later command with unchanged code sends nothing."""

from __future__ import annotations

import hashlib
import io
import tarfile
from dataclasses import dataclass
from pathlib import Path

from hpctrain.config.search import search_path
from hpctrain.workload.code import files_to_copy

CODE, CONF = "code", "conf"


@dataclass(frozen=True)
class Bundle:
    data: bytes  # the tar archive
    digest: str  # its sha256, hex
    files: int


def members(code_dir: Path, include: list[str], config_dir: str | None) -> list[tuple[str, Path]]:
    """(name in the archive, file here) of the code and the added config directories, sorted; a
    config file of an earlier directory wins over the same name in a later one, as on the search
    path."""
    code, _ = files_to_copy(code_dir, include)
    out = {f"{CODE}/{rel.as_posix()}": code_dir / rel for rel in code}
    for source in search_path(config_dir).sources:
        if source.origin == "hpctrain":
            continue
        for f in sorted(p for p in source.path.rglob("*.yaml") if p.is_file()):
            out.setdefault(f"{CONF}/{f.relative_to(source.path).as_posix()}", f)
    return sorted(out.items())


def build(files: list[tuple[str, Path]]) -> Bundle:
    """The archive of `files`, deterministic: the same content gives the same bytes."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, path in files:
            info = tarfile.TarInfo(name)
            data = path.read_bytes()
            info.size, info.mode, info.mtime = len(data), path.stat().st_mode & 0o755, 0
            tar.addfile(info, io.BytesIO(data))
    data = buf.getvalue()
    return Bundle(data, hashlib.sha256(data).hexdigest(), len(files))
