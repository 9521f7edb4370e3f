"""The stall reporter's own diagnosis (train/watchdog.py), in-process with a stand-in clock."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpctrain import records
from hpctrain.train import watchdog as wd


def test_the_reporting_rank_is_not_named_stopped_for_the_time_it_waited_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reporter waits for the other ranks' stacks before it reads every heartbeat; on a loaded
    node that wait outlasted STALE_S once, and the reporter called itself 'stopped, or hung
    outside Python' (a fresh clone's script-stall test). Its own beat is renewed after the wait."""
    clock = [1000.0]
    monkeypatch.setattr(wd.time, "time", lambda: clock[0])
    monkeypatch.setattr(wd.time, "sleep", lambda s: clock.__setitem__(0, clock[0] + 2 * wd.STALE_S))

    def leave(code: int) -> None:
        raise SystemExit(code)

    monkeypatch.setattr(wd.os, "_exit", leave)
    dog = wd.Watchdog(tmp_path, 0, 1, 5)
    dog.phase("compute", 3)
    dog._beat()
    with pytest.raises(SystemExit):
        dog._report()
    stall = json.loads((tmp_path / records.STALL).read_text())
    [named] = stall["stalled"]
    assert named["rank"] == 0 and named["responsive"], stall
    assert "in compute of step 3" in named["why"] and "no heartbeat" not in stall["message"], stall
