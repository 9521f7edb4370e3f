"""A rank's collector held during its start (hpctrain/heap.py): off until release, then on again
with the start's objects frozen out of later collections; nothing happens to a collector the
rank did not turn off."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from hpctrain import heap


@pytest.fixture(autouse=True)
def _restore() -> Iterator[None]:
    was = gc.isenabled()
    yield
    heap._held = False
    gc.unfreeze()
    (gc.enable if was else gc.disable)()


def test_hold_turns_the_collector_off_and_release_freezes_and_turns_it_on() -> None:
    gc.enable()
    gc.unfreeze()
    heap.hold()
    assert not gc.isenabled()
    started = [object() for _ in range(10)]  # what the start allocates
    heap.release()
    assert gc.isenabled() and gc.get_freeze_count() > len(started)
    frozen = gc.get_freeze_count()
    heap.release()  # idempotent: nothing frozen twice
    assert gc.isenabled() and gc.get_freeze_count() == frozen


def test_a_collector_someone_else_turned_off_stays_off() -> None:
    gc.disable()
    gc.unfreeze()
    heap.hold()
    heap.release()
    assert not gc.isenabled() and gc.get_freeze_count() == 0
