"""The wheel cache's manifests: a wheel `hpctrain install horovod` built is installed again only
if the manifest written beside it, atomically and in the same published directory, names it, its
sha256 and the build switches the plan asks for now. A wheel put there by anything else (copied
in, planted, left by an older hpctrain, damaged, or built with other switches, say without MPI) is
never installed, nor is any of its code run: it is built again. Pure but for reading and writing
the directory."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

MANIFEST = "manifest.json"
MAX_MANIFEST = 64 * 1024  # bytes: a manifest is a few hundred


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_manifest(directory: Path, wheel: Path, env: dict[str, str]) -> None:
    """Record `wheel` (in `directory`, the staging directory published whole) and its switches."""
    text = json.dumps({"wheel": wheel.name, "sha256": sha256(wheel), "env": env}, indent=1, sort_keys=True)
    tmp = directory / f".{MANIFEST}.tmp"
    tmp.write_text(text + "\n")
    os.replace(tmp, directory / MANIFEST)


def verified(directory: Path, pattern: str, env: dict[str, str]) -> tuple[Path | None, str]:
    """The one wheel matching `pattern` in `directory` that its manifest vouches for, with `env`'s
    switches; else None and why not ("" when there is no wheel at all)."""
    found = sorted(directory.glob(pattern)) if directory.is_dir() else []
    if not found:
        return None, ""
    if len(found) > 1:
        return (
            None,
            f"{directory} holds {len(found)} wheels ({', '.join(w.name for w in found)}) where a build leaves one",
        )
    wheel, path = found[0], directory / MANIFEST
    try:
        if path.stat().st_size > MAX_MANIFEST:
            return None, f"{path} is larger than any manifest hpctrain writes"
        said = json.loads(path.read_text())
    except FileNotFoundError:
        return (
            None,
            f"{wheel} has no manifest ({MANIFEST}): hpctrain did not build it, or built it before manifests",
        )
    except (OSError, ValueError) as e:
        return None, f"{path} cannot be read ({e})"
    if not isinstance(said, dict) or said.get("wheel") != wheel.name:
        return None, f"{path} does not name {wheel.name}"
    if said.get("env") != env:
        return None, f"{wheel} was built with other switches ({said.get('env')}) than this plan's"
    if said.get("sha256") != sha256(wheel):
        return None, f"{wheel} does not match its manifest's sha256 (damaged or replaced)"
    return wheel, ""
