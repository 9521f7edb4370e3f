"""One status watcher per SLURM launcher (so one per hpctrain command). A look at many jobs is one
`squeue` (the controller: every job still queued or running, its state and pending reason), then
one `sacct` for the jobs that have left the queue since the last look (the accounting database:
how they ended), as SLURM's documentation asks of tools that poll: the controller is asked about
live jobs, accounting about finished ones, once each. Without accounting (a cluster without
slurmdbd, or slurmdbd down) the controller's memory of recently ended jobs (`scontrol show job`,
MinJobAge seconds) stands in, and a job neither knows is ENDED, with a note saying so (its run's
records tell whether it completed).

A command that waits asks less and less often, as submitit's InfoWatcher does: the interval
between two looks is min(MAX_S, max(MIN_S, elapsed / 10)), elapsed counted from the watcher's
first look (again from the next look when new jobs come after every job it knew has ended, as a
tune's trials do): every second for the first 10 s, then 10% of the time waited so far, then
once a minute (and never faster than scheduler.py's rate). While some jobs still run, those that
left the queue are asked of accounting at most every ACCOUNT_S (at once when the last one leaves):
a one-hour wait for a 1,000-task sweep costs about 100 squeue and 12 sacct calls where asking
accounting at every look costs about 100 of each (`hpctrain bench submit`). Jobs that ended are
never asked about again. A look the scheduler does not answer (the controller restarting, slurmdbd down)
keeps the states last seen, noted, for up to UNANSWERED_S; the scheduler's own back-off and rate
are scheduler.py's.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from hpctrain.errors import LaunchError
from hpctrain.launch.slurm.sacct import SQUEUE_FORMAT, JobState, accounting, parse_squeue, remembered
from hpctrain.launch.slurm.scheduler import ask
from hpctrain.records import State

MIN_S, MAX_S, SHARE = 1.0, 60.0, 0.1
ACCOUNT_S = 300.0  # while some jobs still run, those that left the queue are asked of accounting this seldom
UNANSWERED_S = 600.0  # a controller that answers nothing for this long is an error, not a wait


class Unanswered(LaunchError):
    """Neither the controller nor accounting answered a look."""


def look(job_ids: list[str], defer: bool = False) -> dict[str, JobState]:
    """The state of each job: one squeue, then one sacct for what left the queue (runs started as
    steps of an allocation, ALLOC.STEP, are accounting's alone); without accounting, scontrol.
    defer: while some of the jobs are still queued or running, those that left the queue are not
    asked about yet (COMPLETING, noted): a waiting command learns how they ended later, at once."""
    jobs = [j for j in job_ids if "." not in j]
    out: dict[str, JobState] = {}
    gone = [j for j in job_ids if "." in j]
    queue_why = ""
    if jobs:
        answer = ask(["squeue", "-h", "-r", "--me", "-o", SQUEUE_FORMAT], patience_s=60)
        if answer.ok:
            live = parse_squeue(answer.out)
            out.update({j: live[j] for j in jobs if j in live})
            gone += [j for j in jobs if j not in live]
        else:
            queue_why = answer.why()
            gone += jobs
    if not gone:
        return out
    if defer and out and not queue_why and not any("." in j for j in gone):
        note = "left the queue: how it ended is asked of accounting later"
        return out | {j: JobState(j, "", State.COMPLETING, 0, "", "", "", note=note) for j in gone}
    ended, accounting_why = accounting(gone)
    if ended is not None:
        return out | ended
    if queue_why:
        raise Unanswered(f"squeue: {queue_why}; sacct: {accounting_why}")
    known = remembered(gone)
    note = f"accounting unavailable (sacct: {accounting_why[:200]})"
    for j in gone:
        s = known.get(j)
        out[j] = (
            replace(s, note=f"{note}; from the controller")
            if s is not None
            else JobState(j, "", State.ENDED, 0, "", "", "", note=f"{note}; no longer in the queue")
        )
    return out


@dataclass
class StatusWatcher:
    look: Callable[[list[str], bool], dict[str, JobState]] = look
    clock: Callable[[], float] = time.monotonic
    looks: int = 0  # how often it asked the scheduler (for the benchmark and the tests)
    _accounted: float = float("-inf")  # when the last look could ask accounting
    _states: dict[str, JobState] = field(default_factory=dict)
    _first: float | None = None
    _last: float = float("-inf")
    _unanswered: float | None = None  # since when no look was answered

    def interval(self) -> float:
        elapsed = 0.0 if self._first is None else self.clock() - self._first
        return min(MAX_S, max(MIN_S, SHARE * elapsed))

    def due(self) -> bool:
        """Whether the interval since the last look has passed (the next states() asks)."""
        return self.clock() - self._last >= self.interval()

    def states(self, job_ids: list[str]) -> dict[str, JobState]:
        """The state of each of `job_ids` (a pending job's reason in it): looked up when a job is
        new to the watcher or the interval has passed, else as last seen."""
        now = self.clock()
        new = [j for j in job_ids if j not in self._states]
        live = [j for j in job_ids if j in self._states and not self._states[j].done]
        if new and all(s.done for s in self._states.values()):
            self._first = None  # a new wait (runs one after another: a tune's trials) starts afresh
        if new or (live and self.due()):
            self._look([*new, *live], now)
        return {j: self._states[j] for j in job_ids if j in self._states}

    def _look(self, job_ids: list[str], now: float) -> None:
        if self._first is None:
            self._first = now
        self._last = now
        self.looks += 1
        defer = now - self._accounted < ACCOUNT_S
        if not defer:
            self._accounted = now
        try:
            found = self.look(job_ids, defer)
        except Unanswered as e:
            since = self._unanswered = now if self._unanswered is None else self._unanswered
            if any(j not in self._states for j in job_ids) or now - since > UNANSWERED_S:
                raise LaunchError(
                    f"the scheduler does not answer ({e}) for {now - since:.0f} s: is slurmctld running? "
                    "The jobs keep running: ask again with hpctrain status"
                ) from e
            note = f"the scheduler does not answer for {now - since:.0f} s ({str(e)[:160]}): as last seen"
            self._states.update({j: replace(self._states[j], note=note) for j in job_ids})
            return
        self._unanswered = None
        self._states.update(found)
