"""The one door to SLURM's commands (hpctrain/launch/slurm/scheduler.py): counted by command, held
to a token-bucket rate, a busy daemon asked again with back-off, a question with no answer asked
once, and a submission asked again only when it was surely not accepted. A fake clock and fake
answers in SLURM's own words (the real commands' refusals are exercised by the SLURM tests)."""

from __future__ import annotations

from collections.abc import Sequence

from hpctrain.launch.slurm.scheduler import NOT_SUBMITTED, Answer, Scheduler

TIMED_OUT = Answer(1, "", "squeue: error: slurm_load_jobs error: Socket timed out on send/recv operation\n")
INVALID = Answer(1, "", "slurm_load_jobs error: Invalid job id specified\n")
OK = Answer(0, "JobId=7 JobState=RUNNING\n", "")


class Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.now += s


def _scheduler(answers: list[Answer], per_min: float = 30.0) -> tuple[Scheduler, Clock, list[float]]:
    clock, at = Clock(), []

    def runner(argv: Sequence[str], timeout_s: float) -> Answer:
        at.append(clock.now)
        return answers.pop(0) if len(answers) > 1 else answers[0]

    return Scheduler(per_min, runner=runner, clock=lambda: clock.now, sleep=clock.sleep), clock, at


def test_a_burst_then_one_call_every_two_seconds_at_thirty_a_minute() -> None:
    s, clock, at = _scheduler([OK])
    for _ in range(34):
        assert s.ask(["squeue", "-h"]).ok
    # 30 at once (the burst, slurmctld's own default bucket), then one each 60 / 30 = 2 s
    assert at[:30] == [0.0] * 30 and at[30:] == [2.0, 4.0, 6.0, 8.0]
    assert s.counts == {"squeue": 34} and s.total == 34
    clock.now += 600  # idle: the bucket fills again, up to the burst
    for _ in range(30):
        s.ask(["sacct"])
    assert at[-30:] == [608.0] * 30 and s.counts["sacct"] == 30


def test_a_busy_controller_is_asked_again_with_backoff_and_a_bad_question_once() -> None:
    s, clock, at = _scheduler([TIMED_OUT, TIMED_OUT, OK])
    assert s.ask(["scontrol", "show", "job", "7"]).out == OK.out
    assert clock.slept == [1.0, 2.0] and s.retried == 2 and s.counts["scontrol"] == 3
    s, clock, at = _scheduler([INVALID, OK])
    assert not s.ask(["scontrol", "show", "job", "999"]).ok and len(at) == 1 and clock.slept == []
    s, clock, at = _scheduler([TIMED_OUT])  # never answers: back-off until the patience is spent
    answer = s.ask(["squeue"], patience_s=20)
    assert not answer.ok and answer.busy and clock.slept == [1.0, 2.0, 4.0, 8.0]
    assert "Socket timed out" in answer.why()


def test_a_submission_is_asked_again_only_when_it_surely_was_not_accepted() -> None:
    refused = Answer(
        1,
        "",
        "sbatch: error: Batch job submission failed: Unable to contact slurm controller (connect failure)\n",
    )
    s, clock, at = _scheduler([refused, Answer(0, "1234\n", "")])
    assert s.ask(["sbatch", "x.sh"], again=NOT_SUBMITTED).out == "1234\n" and len(at) == 2
    # a timed-out sbatch may have queued the job: never sent twice
    s, clock, at = _scheduler([TIMED_OUT, Answer(0, "1234\n", "")])
    assert not s.ask(["sbatch", "x.sh"], again=NOT_SUBMITTED).ok and len(at) == 1


def test_once_a_call_waited_out_a_down_controller_the_next_calls_try_once_until_one_is_answered() -> None:
    s, clock, at = _scheduler([TIMED_OUT])
    s.ask(["squeue"], patience_s=20)
    waited = len(at)
    assert not s.ask(["sinfo"], patience_s=20).ok and len(at) == waited + 1  # no second wait
    s.runner = lambda argv, timeout_s: OK
    assert s.ask(["sinfo"]).ok
    s.runner = lambda argv, timeout_s: (at.append(clock.now), TIMED_OUT)[1]
    s.ask(["squeue"], patience_s=20)
    assert len(at) == waited + 1 + 5  # answered in between: patient again


def test_a_controller_with_an_rpc_limit_is_kept_to_half_of_it() -> None:
    """slurmctld's rate limiter (SlurmctldParameters=rl_enable, SLURM 23.02+) as `scontrol show
    config` prints it: rl_refill_rate tokens every rl_refill_period s (defaults 2 and 1)."""
    from hpctrain.launch.slurm import scheduler
    from hpctrain.launch.slurm.limits import parse_rpc_limit

    line = "SlurmctldParameters     = enable_configless,rl_enable,rl_bucket_size=50,rl_refill_rate=1,rl_refill_period=4\n"
    assert parse_rpc_limit(line) == 15.0  # 1 token every 4 s
    assert parse_rpc_limit("SlurmctldParameters     = rl_enable\n") == 120.0  # the defaults
    assert parse_rpc_limit("SlurmctldParameters     = (null)\n") is None
    assert parse_rpc_limit("SlurmctldParameters     = enable_configless\n") is None
    kept = scheduler.SCHEDULER.queries_per_min
    try:
        scheduler.configure(30)
        scheduler.keep_under(15.0)
        assert scheduler.SCHEDULER.queries_per_min == 7.5
        scheduler.configure(30)
        scheduler.keep_under(120.0)  # 60 a minute is above the configured 30: 30 stays
        assert scheduler.SCHEDULER.queries_per_min == 30
    finally:
        scheduler.SCHEDULER.queries_per_min = kept


def test_a_command_another_library_runs_goes_through_the_same_door() -> None:
    """submitit's sbatch (submit._sbatch): its own runner, counted, retried only when not accepted."""
    s, clock, at = _scheduler([OK])
    tries: list[float] = []
    refused = Answer(
        1,
        "",
        "sbatch: error: Batch job submission failed: Unable to contact slurm controller (connect failure)",
    )

    def submitit(argv: Sequence[str], timeout_s: float) -> Answer:
        tries.append(clock.now)
        return refused if len(tries) < 3 else Answer(0, "", "")

    assert s.ask(["sbatch"], again=NOT_SUBMITTED, runner=submitit).ok
    assert tries == [0.0, 1.0, 3.0] and at == [] and s.counts["sbatch"] == 3
