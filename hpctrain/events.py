"""Machine-readable lines rank 0 prints among its ordinary output; the launcher turns them into
a progress bar. One JSON object per line after a fixed prefix, so any launcher can parse them."""

from __future__ import annotations

import json
from typing import Any

PREFIX = "@@hpctrain "


def format_event(kind: str, **data: Any) -> str:
    return PREFIX + json.dumps({"event": kind, **data}, separators=(",", ":"))


def parse_event(line: str) -> dict[str, Any] | None:
    """The event on this line, or None for an ordinary line (or a garbled event)."""
    if not line.startswith(PREFIX):
        return None
    try:
        obj = json.loads(line[len(PREFIX) :])
    except json.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) and "event" in obj else None
