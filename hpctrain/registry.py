"""Classes by name, imported on first use: the engine and parallelism axes each keep one
(engine/registry.py, parallel/registry.py). A name maps to "package.module:Class"; planning with
one never imports another's module (Horovod's, say). The class is told its name when loaded.

Another installed package adds one through a Python entry point in the axis's group
(`hpctrain.engines`, `hpctrain.parallelisms`), as pytest's and Hydra's plugins are found:

    [project.entry-points."hpctrain.parallelisms"]
    solo = "my_package.solo:Solo"

Entry points are read once, on the first lookup of a name hpctrain does not ship, or of the list
of names (not at import: a command that uses only built-in names pays nothing); a built-in name is
never replaced by one."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from hpctrain.errors import ConfigError, Problem


def load(target: str) -> Any:
    """What "package.module:name" names, its module imported now ("module:Class.attr" too)."""
    module, _, name = target.partition(":")
    found: Any = importlib.import_module(module)
    for attr in name.split("."):
        found = getattr(found, attr)
    return found


class Named(Protocol):
    name: ClassVar[str]


T = TypeVar("T", bound=Named)


class Registry(Generic[T]):
    def __init__(self, axis: str, targets: dict[str, str], group: str | None = None) -> None:
        self.axis = axis  # what the names name: "engine", "parallelism"
        self.targets = targets  # name -> "module:Class"; a test may edit it and restore it
        self.group = group  # the entry-point group other packages register in
        self._loaded: dict[str, type[T]] = {}
        self._discovered = group is None

    def discover(self) -> None:
        """Add the names other installed packages register (once)."""
        if self._discovered:
            return
        self._discovered = True
        import importlib.metadata  # here: a command that never searches does not import it

        for ep in importlib.metadata.entry_points(group=self.group or ""):
            self.targets.setdefault(ep.name, ep.value)

    def names(self) -> list[str]:
        self.discover()
        return list(self.targets)

    def __contains__(self, name: object) -> bool:
        if name in self.targets:  # a built-in (or found) name: no search
            return True
        self.discover()
        return name in self.targets

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def register(self, name: str, target: str) -> None:
        """Make `target` ("package.module:Class") available as `name`."""
        self.targets[name] = target
        self._loaded.pop(name, None)

    def unknown(self, key: str, name: str) -> Problem:
        names = ", ".join(self.names())
        return Problem(key, f"no {self.axis} named {name!r}: not one of {names}", f"use one of: {names}")

    def get(self, name: str, key: str) -> type[T]:
        """The class registered as `name`; ConfigError naming `key` when there is none."""
        if name not in self:
            raise ConfigError([self.unknown(key, name)])
        if name not in self._loaded:
            target = self.targets[name]
            try:
                cls: type[T] = load(target)
            except (ImportError, AttributeError) as e:
                if target.startswith("hpctrain."):
                    raise  # hpctrain's own: a broken install, a bug; the CLI names it as one
                raise ConfigError.one(
                    key,
                    f"the {self.axis} {name!r} ({self.targets[name]}, from another installed package) "
                    f"cannot be loaded: {type(e).__name__}: {e}",
                    "fix or reinstall that package, or choose another",
                ) from None
            cls.name = name
            self._loaded[name] = cls
        return self._loaded[name]
