"""Classes by name, imported on first use: the engine and parallelism axes each keep one
(engine/registry.py, parallel/registry.py). A name maps to "package.module:Class"; planning with
one never imports another's module (Horovod's, say). The class is told its name when loaded.

Another installed package adds one through a Python entry point in the axis's group
(`hpctrain.engines`, `hpctrain.parallelisms`), as pytest's and Hydra's plugins are found:

    [project.entry-points."hpctrain.parallelisms"]
    solo = "my_package.solo:Solo"

Entry points are read once, on the first lookup of a name hpctrain does not ship, or of the list
of names (not at import: a command that uses only built-in names pays nothing); a built-in name is
never replaced by one. Another package's code is loaded by `load_installed`: its import bounded
in time, its prints sent to stderr, whatever it raises or exits with named as that package's."""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import threading
from collections.abc import Iterator
from typing import Any, ClassVar, Generic, Protocol, TypeVar, cast

from hpctrain.errors import ConfigError, PluginError, Problem

PLUGIN_TIMEOUT_S = 30.0  # HPCTRAIN_PLUGIN_TIMEOUT_S: an import past it is a hung plugin


def load(target: str) -> Any:
    """What "package.module:name" names, its module imported now ("module:Class.attr" too)."""
    module, _, name = target.partition(":")
    found: Any = importlib.import_module(module)
    for attr in name.split("."):
        found = getattr(found, attr)
    return found


def load_installed(target: str, what: str) -> Any:
    """What another installed package's entry point names ("module:Class"), loaded in a daemon
    thread so that an import that hangs is named after HPCTRAIN_PLUGIN_TIMEOUT_S instead of hanging
    hpctrain; what it prints goes to stderr (never into a command's output); an exception, or a
    sys.exit, is a PluginError naming `what` ("the engine 'x'") and the entry point."""
    timeout = float(os.environ.get("HPCTRAIN_PLUGIN_TIMEOUT_S") or PLUGIN_TIMEOUT_S)
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            with contextlib.redirect_stdout(sys.stderr):
                box["found"] = load(target)
        except BaseException as e:  # noqa: BLE001 - SystemExit too: named below, in the caller's thread
            box["error"] = e

    thread = threading.Thread(target=work, name=f"load {target}", daemon=True)
    thread.start()
    thread.join(timeout)
    source = f"{what} ({target}, from another installed package)"
    if thread.is_alive():
        raise PluginError(
            f"{source} did not finish importing in {timeout:g} s; it was left behind. Fix or uninstall "
            "that package, or give it longer with HPCTRAIN_PLUGIN_TIMEOUT_S=<seconds>"
        )
    error = box.get("error")
    if isinstance(error, SystemExit):
        raise PluginError(f"{source} called sys.exit({error.code!r}) while it was imported")
    if error is not None:
        raise PluginError(f"{source} cannot be loaded: {type(error).__name__}: {error}")
    return box["found"]


class Named(Protocol):
    name: ClassVar[str]


T = TypeVar("T", bound=Named)


class Registry(Generic[T]):
    """The classes of one axis (engines, parallelisms) by name: "module:Class" targets imported on
    first use, and those other installed packages register by entry point in `group`, which must
    subclass `base`."""

    def __init__(
        self, axis: str, targets: dict[str, str], group: str | None = None, base: str | None = None
    ) -> None:
        self.axis = axis  # what the names name: "engine", "parallelism"
        self.targets = targets  # name -> "module:Class"; a test may edit it and restore it
        self.group = group  # the entry-point group other packages register in
        self.base = base  # "module:Class" every other package's class must subclass
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
        """The built-in names, then those other installed packages register."""
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
        """The problem of `key` naming no class of this axis, with the names there are."""
        names = ", ".join(self.names())
        return Problem(key, f"no {self.axis} named {name!r}: not one of {names}", f"use one of: {names}")

    def get(self, name: str, key: str) -> type[T]:
        """The class registered as `name`; ConfigError naming `key` when there is none."""
        if name not in self:
            raise ConfigError([self.unknown(key, name)])
        if name not in self._loaded:
            target = self.targets[name]
            cls: type[T] = load(target) if target.startswith("hpctrain.") else self._installed(name, key)
            cls.name = name
            self._loaded[name] = cls
        return self._loaded[name]

    def _installed(self, name: str, key: str) -> type[T]:
        """Another package's class: loaded bounded, and a subclass of the axis's base, or a
        ConfigError naming `key` (it is the config that chose it)."""
        what = f"the {self.axis} {name!r}"
        fix = "fix or reinstall that package, or choose another"
        try:
            cls = load_installed(self.targets[name], what)
        except PluginError as e:
            raise ConfigError.one(key, str(e), fix) from None
        base = load(self.base) if self.base else object
        if not (isinstance(cls, type) and issubclass(cls, base)):
            found = (
                f"the class {cls.__name__}" if isinstance(cls, type) else f"{type(cls).__name__} {cls!r:.40}"
            )
            raise ConfigError.one(
                key,
                f"{what} ({self.targets[name]}, from another installed package) is {found}, "
                f"not a subclass of hpctrain's {base.__name__}",
                fix,
            )
        return cast("type[T]", cls)  # checked above: a subclass of the axis's base
