"""Where hpctrain keeps container images and what it knows of them: Charliecloud's storage
(`ch-image -s`), an image's directory in it, and the record `hpctrain container build` leaves
inside each image (/etc/hpctrain-image.json: its content digest and what went into it)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hpctrain.facts import cache_dir

RECORD = "etc/hpctrain-image.json"  # inside the image; the ranks read /etc/hpctrain-image.json


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
