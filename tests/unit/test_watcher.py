"""The SLURM status watcher: one scheduler call for many jobs, fewer and fewer calls while a
command waits, nothing asked twice about a job that ended (a fake clock and fake queries)."""

from __future__ import annotations

from hpctrain.launch.slurm.sacct import JobState
from hpctrain.launch.slurm.watcher import StatusWatcher


class Scheduler:
    """Jobs that run until their end time (seconds on the fake clock), pending before `start`."""

    def __init__(self, ends: dict[str, float], start: float = 0.0) -> None:
        self.ends, self.start, self.now = ends, start, 0.0
        self.asked: list[tuple[float, list[str]]] = []  # (when, which jobs)

    def sacct(self, ids: list[str]) -> dict[str, JobState]:
        self.asked.append((self.now, list(ids)))
        state = lambda j: (  # noqa: E731
            "PENDING" if self.now < self.start else "COMPLETED" if self.now >= self.ends[j] else "RUNNING"
        )
        return {j: JobState(j, "x", state(j), 1, "00:00:01", "0:0", "n1") for j in ids}

    def squeue(self, ids: list[str]) -> dict[str, str]:
        return {j: "Priority" for j in ids}


def _watcher(s: Scheduler) -> StatusWatcher:
    return StatusWatcher(query=s.sacct, reasons=s.squeue, clock=lambda: s.now)


def test_a_thousand_runs_are_one_sacct_call_and_pending_ones_one_squeue_call() -> None:
    ids = [f"7_{i}" for i in range(1000)]
    s = Scheduler({j: 100.0 for j in ids}, start=50.0)
    w = _watcher(s)
    states, reasons = w.states(ids)
    assert len(states) == 1000 and (w.calls.sacct, w.calls.squeue) == (1, 1)
    assert set(reasons.values()) == {"Priority"}
    w.states(ids)  # at once again: as last seen
    assert (w.calls.sacct, w.calls.squeue) == (1, 1)


def test_waiting_an_hour_costs_about_a_hundred_calls_and_notices_the_end_within_a_tenth() -> None:
    s = Scheduler({"1": 3000.0, "2": 3600.0})
    w = _watcher(s)
    seen: dict[str, float] = {}
    while s.now <= 4000:  # a waiting command polls every second
        states, _ = w.states(["1", "2"])
        for j, st in states.items():
            if st.done:
                seen.setdefault(j, s.now)
        if len(seen) == 2:
            break
        s.now += 1.0
    # every second for 10 s, then 10% of the wait (about 43 looks up to 600 s), then every minute
    assert 90 <= w.calls.sacct <= 115, w.calls.sacct  # polling each second: 3,600
    assert 3000 <= seen["1"] <= 3060 and 3600 <= seen["2"] <= 3660
    # job 1, once seen ended, was never asked about again
    later = [ids for when, ids in s.asked if when > seen["1"]]
    assert later and all(ids == ["2"] for ids in later)


def test_a_new_job_is_looked_up_at_once() -> None:
    s = Scheduler({"1": 10.0, "2": 10.0})
    w = _watcher(s)
    w.states(["1"])
    s.now = 0.2  # within the interval, but job 2 is new to the watcher
    states, _ = w.states(["1", "2"])
    assert set(states) == {"1", "2"} and w.calls.sacct == 2


def test_runs_one_after_another_are_each_watched_from_their_own_start() -> None:
    """A tune's trials: the second, 5 s long, is noticed to end within a second, not 10% of the tune."""
    s = Scheduler({"1": 3000.0, "2": float("inf")})
    w = _watcher(s)
    while not w.states(["1"])[0]["1"].done:
        s.now += 1.0
    start = s.now  # job 1 was noticed late (a minute between looks by then): job 2 starts now
    s.ends["2"] = start + 5.0
    while not w.states(["2"])[0]["2"].done:
        s.now += 1.0
    assert s.now - start <= 6.0, (start, s.now)
