"""One status watcher per SLURM launcher (so one per hpctrain command): every job the command
asks about is looked up in one `sacct` call (and one `squeue` call for the pending ones), and a
command that waits asks the scheduler less and less often, as submitit's InfoWatcher does.

The interval between two looks is min(MAX_S, max(MIN_S, elapsed / 10)), elapsed counted from
the watcher's first look (again from the next look when new jobs come after every job it knew
has ended, as a tune's trials do, one after another): every second for the first 10 s, then 10%
of the time waited so far, then once a minute. A job that ends is noticed at most 10% of its wait late, and a one-hour wait
costs about 100 calls instead of 3,600. Jobs that have ended are never asked about again. An
array whose tasks are all asked about is asked for by its id alone, so the command line stays
short whatever the sweep's size.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from hpctrain.launch.slurm.sacct import JobState, pending_reasons, sacct
from hpctrain.records import State

MIN_S, MAX_S, SHARE = 1.0, 60.0, 0.1


@dataclass
class Calls:
    """How often the watcher asked the scheduler (for the benchmark and the tests)."""

    sacct: int = 0
    squeue: int = 0


@dataclass
class StatusWatcher:
    query: Callable[[list[str]], dict[str, JobState]] = sacct
    reasons: Callable[[list[str]], dict[str, str]] = pending_reasons
    clock: Callable[[], float] = time.monotonic
    calls: Calls = field(default_factory=Calls)
    _states: dict[str, JobState] = field(default_factory=dict)
    _reasons: dict[str, str] = field(default_factory=dict)
    _first: float | None = None
    _last: float = float("-inf")

    def interval(self) -> float:
        elapsed = 0.0 if self._first is None else self.clock() - self._first
        return min(MAX_S, max(MIN_S, SHARE * elapsed))

    def states(self, job_ids: list[str]) -> tuple[dict[str, JobState], dict[str, str]]:
        """(state by job id, the controller's pending reason by job id) for `job_ids`: looked up
        when a job is new to the watcher or the interval has passed, else as last seen."""
        now = self.clock()
        new = [j for j in job_ids if j not in self._states]
        live = [j for j in job_ids if j in self._states and not self._states[j].done]
        if new and all(s.done for s in self._states.values()):
            self._first = None  # a new wait (runs one after another: a tune's trials) starts afresh
        if new or (live and now - self._last >= self.interval()):
            self._look([*new, *live], now)
        found = {j: self._states[j] for j in job_ids if j in self._states}
        return found, {j: r for j, r in self._reasons.items() if j in found}

    def _look(self, job_ids: list[str], now: float) -> None:
        if self._first is None:
            self._first = now
        self._last = now
        self.calls.sacct += 1
        found = self.query(job_ids)
        self._states.update(found)
        pending = [k for k, s in found.items() if s.state == State.PENDING]
        for k in found:
            self._reasons.pop(k, None)
        if pending:
            self.calls.squeue += 1
            self._reasons.update(self.reasons(pending))
