"""Configuration: the typed schema, loading with Hydra, the quantities derived from a config and
its own cross-field rules (the axes add theirs: orchestrate/validate.py)."""

from hpctrain.config.load import load_config
from hpctrain.config.plain_yaml import to_yaml
from hpctrain.config.schema import Config

__all__ = ["Config", "load_config", "to_yaml"]
