"""Configuration: the typed schema, loading with Hydra, and cross-field validation."""

from .load import load_config, to_yaml
from .schema import Config
from .validate import validate, validate_points

__all__ = ["Config", "load_config", "to_yaml", "validate", "validate_points"]
