"""The parallel dimensions that are packages of their own (hpctrain/parallel/<name>/), by the name
of their mesh dimension: one line here registers one. Each layer of the house finds what it needs
in the package by a module's name, imported on first use, never by importing it:

  <package>.settings:HOLDER      its parallelism.<name>.* keys (config/schema.py adds them), if it
                                 has a settings module (the pipeline's and tensor parallelism's keys predate the table)
  <package>.dimension:DIMENSION  its plan-time rules, layout, notes and rank side (parallel/dimensions.py)
  <package>.figures:PARTS        its record parts, one per level (records/parts.py)
  <package>.report:report_rows   its rows of a run's summary (analysis/part_rows.py)
  <package>.report:STUDY         its view of a study (analysis/study_parts.py)

Each entry is (the package, the key of its parts in the records)."""

from __future__ import annotations

PACKAGES: dict[str, tuple[str, str]] = {
    "pp": ("hpctrain.parallel.pipeline", "pipeline"),
    "cp": ("hpctrain.parallel.context", "context"),
    "tp": ("hpctrain.parallel.tensor", "tensor"),
}


def modules(module: str, attr: str) -> dict[str, str]:
    """ "package.<module>:<attr>" of every registered package, by its name."""
    return {name: f"{package}.{module}:{attr}" for name, (package, _) in PACKAGES.items()}


def by_part(module: str, attr: str) -> dict[str, str]:
    """ "package.<module>:<attr>" of every registered package, by the key of its parts."""
    return {key: f"{package}.{module}:{attr}" for package, key in PACKAGES.values()}


def with_settings() -> dict[str, str]:
    """ "package.settings:HOLDER" of the packages that have a settings module, by name."""
    from importlib.util import find_spec

    return {
        name: f"{package}.settings:HOLDER"
        for name, (package, _) in PACKAGES.items()
        if find_spec(f"{package}.settings") is not None
    }
