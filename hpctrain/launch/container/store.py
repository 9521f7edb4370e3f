"""Where hpctrain keeps container images and what it knows of them: Charliecloud's storage
(`ch-image -s`), an image's directory in it, and the record `hpctrain container build` leaves
inside each image (/etc/hpctrain-image.json: its content digest and what went into it)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

RECORD = "etc/hpctrain-image.json"  # inside the image; the ranks read /etc/hpctrain-image.json


def cache_dir() -> Path:
    """The cache scripts/setup.sh uses too: $HPCTRAIN_CACHE, else $XDG_CACHE_HOME/hpctrain."""
    explicit = os.environ.get("HPCTRAIN_CACHE")
    if explicit:
        return Path(explicit)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "hpctrain"


def default_storage() -> Path:
    return cache_dir() / "charliecloud"


def image_dir(storage: Path, name: str) -> Path:
    """ch-image's directory for an image name (':' becomes '+', '/' becomes '%')."""
    return storage / "img" / name.replace(":", "+").replace("/", "%")


def read_record(image_root: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((image_root / RECORD).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
