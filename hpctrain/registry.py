"""Classes by name, imported on first use: the engine and parallelism axes each keep one
(engine/registry.py, parallel/registry.py). A name maps to "package.module:Class"; planning with
one never imports another's module (Horovod's, say). The class is told its name when loaded."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from typing import ClassVar, Generic, Protocol, TypeVar

from hpctrain.errors import ConfigError, Problem


class Named(Protocol):
    name: ClassVar[str]


T = TypeVar("T", bound=Named)


class Registry(Generic[T]):
    def __init__(self, axis: str, targets: dict[str, str]) -> None:
        self.axis = axis  # what the names name: "engine", "parallelism"
        self.targets = targets  # name -> "module:Class"; a test may edit it and restore it
        self._loaded: dict[str, type[T]] = {}

    def __contains__(self, name: object) -> bool:
        return name in self.targets

    def __iter__(self) -> Iterator[str]:
        return iter(list(self.targets))

    def register(self, name: str, target: str) -> None:
        """Make `target` ("package.module:Class") available as `name`."""
        self.targets[name] = target
        self._loaded.pop(name, None)

    def unknown(self, key: str, name: str) -> Problem:
        names = ", ".join(self.targets)
        return Problem(key, f"no {self.axis} named {name!r}: not one of {names}", f"use one of: {names}")

    def get(self, name: str, key: str) -> type[T]:
        """The class registered as `name`; ConfigError naming `key` when there is none."""
        if name not in self.targets:
            raise ConfigError([self.unknown(key, name)])
        if name not in self._loaded:
            module, _, cls_name = self.targets[name].partition(":")
            cls: type[T] = getattr(importlib.import_module(module), cls_name)
            cls.name = name
            self._loaded[name] = cls
        return self._loaded[name]
