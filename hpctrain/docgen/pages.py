"""The generated pages by file name (docs/reference/<name>)."""

from __future__ import annotations

from hpctrain.docgen import cli_ref, config_ref, exits_ref
from hpctrain.resources import shipped


def generated() -> dict[str, str]:
    from hpctrain.parser import build_parser

    return {
        "config.md": config_ref.render(shipped("conf")),
        "cli.md": cli_ref.render(build_parser()),
        "exit-status.md": exits_ref.render(),
    }
