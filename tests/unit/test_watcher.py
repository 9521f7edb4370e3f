"""The SLURM status watcher: one look for many jobs, fewer and fewer looks while a command
waits, nothing asked twice about a job that ended, a scheduler that does not answer waited out
(a fake clock and fake looks); and a look's queries: one squeue for the live jobs, one sacct for
those that left the queue, the controller's memory without accounting (fake SLURM answers)."""

from __future__ import annotations

import pytest

from hpctrain.errors import LaunchError
from hpctrain.launch.slurm import scheduler
from hpctrain.launch.slurm.sacct import SQUEUE_FORMAT, JobState
from hpctrain.launch.slurm.scheduler import Answer
from hpctrain.launch.slurm.scheduler import Scheduler as Client
from hpctrain.launch.slurm.watcher import UNANSWERED_S, StatusWatcher, Unanswered, look
from hpctrain.records import State


class Scheduler:
    """Jobs that run until their end time (seconds on the fake clock), pending before `start`."""

    def __init__(self, ends: dict[str, float], start: float = 0.0) -> None:
        self.ends, self.start, self.now = ends, start, 0.0
        self.asked: list[tuple[float, list[str]]] = []  # (when, which jobs)

    def look(self, ids: list[str], defer: bool = False) -> dict[str, JobState]:
        self.asked.append((self.now, list(ids)))
        state = lambda j: (  # noqa: E731
            State.PENDING
            if self.now < self.start
            else State.COMPLETED
            if self.now >= self.ends[j]
            else State.RUNNING
        )
        return {
            j: JobState(
                j, "x", state(j), 1, "00:00:01", "0:0", "n1", "Priority" if self.now < self.start else ""
            )
            for j in ids
        }


def _watcher(s: Scheduler) -> StatusWatcher:
    return StatusWatcher(look=s.look, clock=lambda: s.now)


def test_a_thousand_runs_are_one_look() -> None:
    ids = [f"7_{i}" for i in range(1000)]
    s = Scheduler({j: 100.0 for j in ids}, start=50.0)
    w = _watcher(s)
    states = w.states(ids)
    assert len(states) == 1000 and w.looks == 1
    assert {st.reason for st in states.values()} == {"Priority"}
    w.states(ids)  # at once again: as last seen
    assert w.looks == 1


def test_waiting_an_hour_costs_about_a_hundred_calls_and_notices_the_end_within_a_tenth() -> None:
    s = Scheduler({"1": 3000.0, "2": 3600.0})
    w = _watcher(s)
    seen: dict[str, float] = {}
    while s.now <= 4000:  # a waiting command polls every second
        states = w.states(["1", "2"])
        for j, st in states.items():
            if st.done:
                seen.setdefault(j, s.now)
        if len(seen) == 2:
            break
        s.now += 1.0
    # every second for 10 s, then 10% of the wait (about 43 looks up to 600 s), then every minute
    assert 90 <= w.looks <= 115, w.looks  # polling each second: 3,600
    assert 3000 <= seen["1"] <= 3060 and 3600 <= seen["2"] <= 3660
    # job 1, once seen ended, was never asked about again
    later = [ids for when, ids in s.asked if when > seen["1"]]
    assert later and all(ids == ["2"] for ids in later)


def test_a_new_job_is_looked_up_at_once() -> None:
    s = Scheduler({"1": 10.0, "2": 10.0})
    w = _watcher(s)
    w.states(["1"])
    s.now = 0.2  # within the interval, but job 2 is new to the watcher
    states = w.states(["1", "2"])
    assert set(states) == {"1", "2"} and w.looks == 2


def test_runs_one_after_another_are_each_watched_from_their_own_start() -> None:
    """A tune's trials: the second, 5 s long, is noticed to end within a second, not 10% of the tune."""
    s = Scheduler({"1": 3000.0, "2": float("inf")})
    w = _watcher(s)
    while not w.states(["1"])["1"].done:
        s.now += 1.0
    start = s.now  # job 1 was noticed late (a minute between looks by then): job 2 starts now
    s.ends["2"] = start + 5.0
    while not w.states(["2"])["2"].done:
        s.now += 1.0
    assert s.now - start <= 6.0, (start, s.now)


def test_a_scheduler_that_stops_answering_is_waited_out_then_named() -> None:
    """The controller restarts mid-wait: the jobs keep their last states, noted, for UNANSWERED_S;
    then the wait is an error that names it. A job never seen before is an error at once."""
    s = Scheduler({"1": 10_000.0})
    down = {"on": False}

    def look_(ids: list[str], defer: bool) -> dict[str, JobState]:
        if down["on"]:
            raise Unanswered("squeue: Unable to contact slurm controller (connect failure); sacct: ...")
        return s.look(ids)

    w = StatusWatcher(look=look_, clock=lambda: s.now)
    assert w.states(["1"])["1"].state == State.RUNNING
    down["on"] = True
    s.now = 100.0
    kept = w.states(["1"])["1"]
    assert kept.state == State.RUNNING and "does not answer" in kept.note
    with pytest.raises(LaunchError, match="does not answer"):
        w.states(["1", "2"])  # job 2 is new: nothing to keep
    s.now = 100.0 + UNANSWERED_S + 61
    with pytest.raises(LaunchError, match="is slurmctld running"):
        w.states(["1"])
    down["on"] = False  # it answers again: the wait goes on
    s.now += 61
    assert w.states(["1"])["1"].note == ""


SQUEUE = "1519|train|RUNNING|2|0:02|n[1-2]|None\n1153_8|sweep|PENDING|1|0:00||JobArrayTaskLimit\n"
SACCT_1400 = "1400|train|COMPLETED|1|00:00:09|0:0|n3|None\n"
SCONTROL_1400 = (
    "JobId=1400 JobName=train UserId=root(0) JobState=FAILED Reason=NonZeroExitCode ExitCode=1:0 "
    "RunTime=00:00:04 NodeList=n3 NumNodes=1\n"
    "JobId=1401 ArrayJobId=1153 ArrayTaskId=9 JobName=sweep JobState=COMPLETED Reason=None ExitCode=0:0 "
    "RunTime=00:00:02 NodeList=n1 NumNodes=1\n"
)


def _slurm(monkeypatch: pytest.MonkeyPatch, answers: dict[str, Answer]) -> list[list[str]]:
    """SLURM's commands answered from `answers` by command name (their real output's format)."""
    asked: list[list[str]] = []

    def runner(argv, timeout_s):  # noqa: ANN001, ANN202
        asked.append(list(argv))
        return answers[argv[0]]

    monkeypatch.setattr(scheduler, "SCHEDULER", Client(runner=runner, sleep=lambda s: None))
    return asked


def test_a_look_asks_the_controller_for_live_jobs_and_accounting_for_the_rest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked = _slurm(monkeypatch, {"squeue": Answer(0, SQUEUE, ""), "sacct": Answer(0, SACCT_1400, "")})
    found = look(["1519", "1153_8", "1400"])
    assert [a[0] for a in asked] == ["squeue", "sacct"]
    assert asked[0] == ["squeue", "-h", "-r", "--me", "-o", SQUEUE_FORMAT]
    assert asked[1][-2:] == ["-j", "1400"]  # only the job that left the queue
    assert (found["1519"].state, found["1519"].nodes) == (State.RUNNING, 2)
    assert (found["1153_8"].state, found["1153_8"].reason) == (State.PENDING, "JobArrayTaskLimit")
    assert (found["1400"].state, found["1400"].exit_code) == (State.COMPLETED, "0:0")
    asked.clear()
    look(["1519"])
    assert [a[0] for a in asked] == ["squeue"]  # every job live: accounting is not asked
    asked.clear()
    found = look(["1519", "1400"], defer=True)  # a waiting command between two accounting looks
    assert [a[0] for a in asked] == ["squeue"]
    assert found["1400"].state == State.COMPLETING and not found["1400"].done
    asked.clear()
    assert look(["1400"], defer=True)["1400"].state == State.COMPLETED  # the last one left: asked at once
    assert [a[0] for a in asked] == ["squeue", "sacct"]


def test_without_accounting_the_controller_says_how_recent_jobs_ended_and_the_rest_are_ended(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A cluster without slurmdbd: sacct says so; `scontrol show job` still holds jobs that ended
    within MinJobAge (an array task by its array's id); a job it forgot is ENDED, and each says why."""
    off = Answer(1, "", "Slurm accounting storage is disabled\n")
    asked = _slurm(
        monkeypatch,
        {"squeue": Answer(0, SQUEUE, ""), "sacct": off, "scontrol": Answer(0, SCONTROL_1400, "")},
    )
    found = look(["1519", "1400", "1153_9", "999"])
    assert [a[0] for a in asked] == ["squeue", "sacct", "scontrol"]
    assert (found["1400"].state, found["1400"].exit_code) == (State.FAILED, "1:0")
    assert found["1153_9"].state == State.COMPLETED
    assert found["999"].state == State.ENDED and found["999"].done
    assert found["1519"].note == ""  # live: the controller's own word
    assert all(
        found[j].note.startswith("accounting unavailable (sacct: Slurm accounting storage is disabled)")
        for j in ("1400", "1153_9", "999")
    )


def test_a_look_neither_daemon_answers_is_unanswered(monkeypatch: pytest.MonkeyPatch) -> None:
    down = Answer(1, "", "squeue: error: Invalid user for SlurmUser slurm, ignored\n")
    _slurm(
        monkeypatch, {"squeue": down, "sacct": Answer(1, "", "sacct: error: Problem talking to the database")}
    )
    with pytest.raises(Unanswered, match="squeue: .*; sacct: .*Problem talking to the database"):
        look(["1519"])


def test_an_hours_wait_for_a_thousand_tasks_asks_accounting_a_dozen_times_not_at_every_look() -> None:
    """bench/waiting.py's fake hour (1,000 tasks ending one after another, 64 at a time): the
    controller at every look, accounting every ACCOUNT_S and when the last task leaves; asking
    accounting at every look (the way before) reads the whole array's records each time."""
    from hpctrain.bench.waiting import HOUR_S, sacct_every_look, simulate

    ours, before = simulate(1000), simulate(1000, sacct_every_look)
    assert ours.counts["sacct"] == 12  # every 300 s of the hour, the last one when the sweep ended
    assert 90 <= ours.counts["squeue"] == ours.looks <= 110
    assert sum(ours.counts.values()) < 0.7 * sum(before.counts.values())
    assert ours.sacct_rows == 12 * 1000 and before.sacct_rows == before.counts["sacct"] * 1000
    assert HOUR_S <= ours.noticed_s <= HOUR_S + 60 and ours.noticed_s == before.noticed_s
