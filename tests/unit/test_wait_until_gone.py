"""The suite's judge of leftover processes (tests/conftest.py wait_until_gone): a process past its
deadline is waited for only while it shows it is on its way out; one asleep is an orphan."""

from __future__ import annotations

import subprocess
import sys
import time

from tests.conftest import _exiting


def test_a_sleeping_process_shows_no_sign_of_exiting_and_a_busy_one_does() -> None:
    asleep = subprocess.Popen(["sleep", "100"])
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.5)
        first = {p.pid: _exiting(p.pid, None)[1] for p in (asleep, busy)}
        time.sleep(0.5)
        assert _exiting(asleep.pid, first[asleep.pid])[0] is None
        reason, _ = _exiting(busy.pid, first[busy.pid])
        assert reason is not None and reason.startswith("used ")
    finally:
        for p in (asleep, busy):
            p.kill()
            p.wait()
    assert _exiting(asleep.pid, None) == ("gone", None)
