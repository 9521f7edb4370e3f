"""The files hpctrain ships beside its code (configs, container recipes): inside the installed
package, where the build maps them (setup.py: conf/ -> hpctrain/conf); run from a source checkout
or an editable install, at the repository's top level, where the project's layout keeps them."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from hpctrain.errors import HpctrainError


def shipped(name: str) -> Path:
    """The directory `name` (conf, containers) as this hpctrain carries it."""
    inside = Path(str(files("hpctrain") / name))
    if inside.is_dir():
        return inside
    top = Path(__file__).resolve().parents[1] / name  # a checkout: the package's parent
    if top.is_dir() and (top.parent / "pyproject.toml").is_file():
        return top
    raise HpctrainError(
        f"this hpctrain ({Path(__file__).parent}) carries no {name}/: its install is incomplete; "
        "reinstall it (pip install --force-reinstall hpctrain)"
    )
