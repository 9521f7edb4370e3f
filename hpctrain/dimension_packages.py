"""The parallel dimensions that are packages of their own (hpctrain/parallel/<name>/), by the name
of their mesh dimension, and the parallelisms that are (by their parts' key): one line here
registers one. Each layer of the house finds what it needs
in the package by a module's name, imported on first use, never by importing it:

  <package>.settings:HOLDER      its parallelism.<name>.* keys (config/schema.py adds them), if it
                                 has a settings module (the pipeline's and tensor parallelism's keys predate the table)
  <package>.dimension:DIMENSION  its plan-time rules, layout, notes and rank side (parallel/dimensions.py;
                                 a dimension's only)
  <package>.figures:PARTS        its record parts, one per level (records/parts.py)
  <package>.report:report_rows   its rows of a run's summary (analysis/part_rows.py)
  <package>.report:STUDY         its view of a study (analysis/study_parts.py)

Each entry is (the package, the key of its parts in the records)."""

from __future__ import annotations

from functools import cache

PACKAGES: dict[str, tuple[str, str]] = {
    "pp": ("hpctrain.parallel.pipeline", "pipeline"),
    "cp": ("hpctrain.parallel.context", "context"),
    "tp": ("hpctrain.parallel.tensor", "tensor"),
}


# the parallelisms that are packages of their own (their kinds are registered in
# parallel/registry.py), by the key of their parts: their records and report are found as the
# dimensions' are
PARALLELISM_PACKAGES: dict[str, str] = {
    "shards": "hpctrain.parallel.sharded",
}


def modules(module: str, attr: str) -> dict[str, str]:
    """ "package.<module>:<attr>" of every registered package, by its name."""
    return {name: f"{package}.{module}:{attr}" for name, (package, _) in PACKAGES.items()}


def by_part(module: str, attr: str) -> dict[str, str]:
    """ "package.<module>:<attr>" of every registered package that has the module, the dimensions'
    then the parallelisms', by the key of its parts."""
    packages = [(key, package) for package, key in PACKAGES.values()] + list(PARALLELISM_PACKAGES.items())
    return {key: f"{package}.{module}:{attr}" for key, package in packages if _has(package, module)}


def with_settings() -> dict[str, str]:
    """ "package.settings:HOLDER" of the packages that have a settings module, by name."""
    return {
        name: f"{package}.settings:HOLDER"
        for name, (package, _) in PACKAGES.items()
        if _has(package, "settings")
    }


@cache
def _has(package: str, module: str) -> bool:
    """Whether the package has the module, looked up once (the summary table asks per part)."""
    from importlib.util import find_spec

    return find_spec(f"{package}.{module}") is not None
