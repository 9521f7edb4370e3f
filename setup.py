"""The build maps the repository's top-level conf/ and containers/ into the package
(hpctrain/conf, hpctrain/containers): the project's layout keeps them at the top, and the wheel
ships them, so an installed hpctrain reads nothing from a source tree. Everything else is in
pyproject.toml."""

from pathlib import Path

from setuptools import find_namespace_packages, find_packages, setup

HERE = Path(__file__).parent
# each config group is a directory of YAML files: a data-only package of its own
GROUPS = sorted(d.name for d in (HERE / "conf").iterdir() if d.is_dir() and d.name != "__pycache__")
SHIPPED = {"hpctrain.conf": "conf", "hpctrain.containers": "containers"}

setup(
    packages=find_packages(include=["hpctrain", "hpctrain.*"])
    + find_namespace_packages(include=["hydra_plugins.*"])
    + list(SHIPPED)
    + [f"hpctrain.conf.{g}" for g in GROUPS],
    package_dir=SHIPPED,
    package_data={
        "hpctrain": ["py.typed"],
        "hpctrain.conf": ["*.yaml"],
        **{f"hpctrain.conf.{g}": ["*.yaml"] for g in GROUPS},
        "hpctrain.containers": ["Dockerfile", "*.Dockerfile", "*.def"],
    },
)
