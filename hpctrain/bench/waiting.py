"""What waiting for a sweep costs the scheduler, over an hour, on a fake clock: the real status
watcher and its real look (hpctrain/launch/slurm/watcher.py) ask a stand-in SLURM that answers
squeue, sacct and scontrol in their real formats for a sweep whose tasks start ARRAY_PARALLELISM at
a time and end one after another until the hour is out. Counted by the real scheduler door
(scheduler.py: what would have reached slurmctld and slurmdbd), with the rate it holds to."""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from hpctrain.launch.slurm import scheduler
from hpctrain.launch.slurm.sacct import JobState, accounting
from hpctrain.launch.slurm.scheduler import Answer, Scheduler, ask
from hpctrain.launch.slurm.watcher import StatusWatcher, look
from hpctrain.records import State

HOUR_S = 3600.0
ARRAY_PARALLELISM = 64  # cluster.array_parallelism's default


@dataclass(frozen=True)
class Waited:
    counts: dict[str, int]  # SLURM commands by name
    looks: int
    sacct_rows: int  # job ids asked of accounting, summed over its calls (slurmdbd's load)
    noticed_s: float  # when the waiting command saw the last task end


class Sweep:
    """Task i of `points` ends at (i + 1) / points of the hour; at most ARRAY_PARALLELISM run."""

    def __init__(self, array: str, points: int) -> None:
        self.array, self.points, self.now, self.sacct_rows = array, points, 0.0, 0
        self.ends = [HOUR_S * (i + 1) / points for i in range(points)]

    def _state(self, i: int) -> State:
        if self.now >= self.ends[i]:
            return State.COMPLETED
        first_live = bisect.bisect_right(self.ends, self.now)  # the tasks end in order: those ended
        return State.RUNNING if i < first_live + ARRAY_PARALLELISM else State.PENDING

    def answer(self, argv: Sequence[str], timeout_s: float) -> Answer:
        tool = argv[0]
        if tool == "squeue":
            lines = [
                f"{self.array}_{i}|sweep|{s}|1|0:10|{'n1' if s == State.RUNNING else ''}|"
                f"{'JobArrayTaskLimit' if s == State.PENDING else 'None'}"
                for i in range(self.points)
                if (s := self._state(i)) != State.COMPLETED
            ]
            return Answer(0, "\n".join(lines) + "\n", "")
        if tool == "sacct":  # -j ARRAY lists every task of the array (the pending ones too, here)
            self.sacct_rows += self.points
            rows = [
                f"{self.array}_{i}|sweep|{self._state(i)}|1|00:00:10|0:0|n1|None" for i in range(self.points)
            ]
            return Answer(0, "\n".join(rows) + "\n", "")
        return Answer(1, "", f"{tool}: not part of this simulation")


def sacct_every_look(job_ids: list[str], defer: bool = False) -> dict[str, JobState]:
    """The hand-written equivalent of the way before (submitit's too): accounting asked about every
    job at every look, and the controller about the pending ones' reasons."""
    found, _ = accounting(job_ids)
    pending = [j for j, s in (found or {}).items() if s.state == State.PENDING]
    if pending:
        ask(["squeue", "-h", "-r", "-t", State.PENDING.value, "-o", "%i|%r", "-j", ",".join(pending)])
    return found or {}


def simulate(points: int, way: Callable[[list[str], bool], dict[str, JobState]] = look) -> Waited:
    """Wait for a `points`-task sweep as `hpctrain run` waits (a look offered every second), the
    scheduler asked `way`."""
    sweep = Sweep("7000", points)
    door = Scheduler(runner=sweep.answer, clock=lambda: sweep.now)

    def sleep(s: float) -> None:
        sweep.now += s

    door.sleep = sleep
    kept = scheduler.SCHEDULER
    scheduler.SCHEDULER = door
    try:
        watcher = StatusWatcher(look=way, clock=lambda: sweep.now)
        ids = [f"7000_{i}" for i in range(points)]
        while sweep.now < 2 * HOUR_S:
            states = watcher.states(ids)
            if len(states) == points and all(s.done for s in states.values()):
                break
            sweep.now += 1.0
            while not watcher.due() and sweep.now < 2 * HOUR_S:  # an offer between looks sees the
                sweep.now += 1.0  # last look's states: skipped, the counts the same
    finally:
        scheduler.SCHEDULER = kept
    return Waited(dict(door.counts), watcher.looks, sweep.sacct_rows, sweep.now)
