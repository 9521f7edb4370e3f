"""Hydra's process-wide state while hpctrain composes: what a compose would change is put back,
and what it would copy for nothing is shared. hpctrain composes with Hydra's compose API inside
other programs too (its Hydra launcher plugin, a user's Hydra app, tests), which keep their own."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


def _same_store(store: object, memo: dict[int, object]) -> object:
    return store


@contextlib.contextmanager
def store_shared() -> Iterator[None]:
    """While hpctrain composes: Hydra copies its config repository at every compose
    (CachingConfigRepository, "to avoid mutating it with initialize_sources()"), and with it the
    ConfigStore singleton that its schema source holds: every structured config stored, Hydra's
    and hpctrain's, about a fifth of a compose's CPU. The store is a singleton whose load() copies
    each node it hands out, so within a compose a copy of the store can be the store. Only there:
    Hydra's Singleton.get_state() (its launchers, its tests' hydra_restore_singletons) copies the
    store to keep its state, which must stay a copy."""
    from hydra.core.config_store import ConfigStore

    added = "__deepcopy__" not in vars(ConfigStore)
    if added:
        setattr(ConfigStore, "__deepcopy__", _same_store)  # noqa: B010 (a class attribute Hydra lacks)
    try:
        yield
    finally:
        if added:
            delattr(ConfigStore, "__deepcopy__")


@contextlib.contextmanager
def version_base_kept() -> Iterator[None]:
    """initialize_config_dir sets Hydra's process-wide version base and leaves it: put back, so a
    Hydra app that calls hpctrain (its launcher plugin, a test) keeps its own (job.chdir's default)."""
    from hydra.version import VersionBase

    base = VersionBase.instance().getbase()
    try:
        yield
    finally:
        VersionBase.instance().version_base = base
