"""A run's config.yaml as the ranks read it. The plan is the one source of truth: `hpctrain run`
validated the config, derived plan.json from it (batch sizes, learning rate, layout, memory
bound) and recorded the file's sha256 there. A rank, and the SLURM job's restart code, read the
file only if it is still what was planned; an edited one is refused naming both files, since a
value `hpctrain run` would refuse (`steps: 10**20`, `lr: .nan`, `'???'`) or one the plan no
longer matches (`lr`, which plan.json holds scaled) would otherwise be trained on, or silently
not. A plan written before the digest was recorded reads the file as before."""

from __future__ import annotations

import hashlib
from pathlib import Path

from hpctrain import bounded, records
from hpctrain.config.load import config_from_yaml
from hpctrain.config.schema import Config
from hpctrain.config.yaml_bounds import BadYaml, compose
from hpctrain.errors import ConfigError, RecordError

PLANNED_KEY = "config_sha256"  # in plan.json (launch/rundir.py writes it)
FIX = "plan the run again (hpctrain run with the new values), or restore the file as it was written"


class ConfigChanged(ConfigError):
    """config.yaml is not the file its plan was made from."""

    quiet = True  # the message names both files; a rank's stack would not help


def digest(text: str) -> str:
    """The sha256 plan.json records of a config.yaml's text (as to_yaml writes it). Pure."""
    return hashlib.sha256(text.encode()).hexdigest()


def run_config(path: Path, planned: str | None) -> Config:
    """The Config of a run's config.yaml, read with a bound; `planned`: the sha256 its plan.json
    records (None: a plan without it). ConfigChanged if the file differs from what was planned,
    ConfigError if it cannot be read."""
    try:
        data = bounded.read_bytes(path, bounded.TEXT)
    except OSError as e:
        raise ConfigError.one(str(path), f"cannot be read ({e.strerror or e})", FIX) from None
    found = hashlib.sha256(data).hexdigest()
    if planned is not None and found != planned:
        raise ConfigChanged.one(
            str(path),
            f"was changed after the run was planned (sha256 {found[:12]}; {path.parent / 'plan.json'} "
            f"was made from {planned[:12]}): a run trains only on the config it was planned with",
            FIX,
        )
    try:
        text = data.decode("utf-8")
        if planned is None:  # no digest to hold it to: read within yaml_bounds' bounds first
            compose(text)
    except UnicodeDecodeError as e:
        raise ConfigError.one(str(path), f"is not UTF-8 text (byte {e.start}: {e.reason})", FIX) from None
    except BadYaml as e:
        raise ConfigError.one(str(path), str(e), FIX) from None
    return config_from_yaml(text)


def planned_config(run_dir: Path) -> Config:
    """The run's config.yaml, held to the digest its plan.json records (run_config)."""
    try:
        planned = records.read_json(run_dir / records.PLAN).get(PLANNED_KEY)
    except (RecordError, AttributeError):  # no plan to hold it to: the rank's own read of it says why
        planned = None
    return run_config(run_dir / records.CONFIG, planned if isinstance(planned, str) else None)
