"""Every SLURM command hpctrain runs goes through this process's one Scheduler: it counts them by
command, keeps them under a rate, and asks again with back-off when the controller or the
accounting daemon is busy, restarting or limiting RPCs, instead of taking a busy controller for a
failed job (clusters set per-user RPC limits, and admins ask tools to query less: submitit#1759).

The rate is a token bucket, as slurmctld's own RPC limiter (SlurmctldParameters=rl_enable): a
command may make BURST calls at once, then one every 60 / queries_per_min seconds. A refused call
("Socket timed out on send/recv operation", "Unable to contact slurm controller", a rate limit) is
asked again after 1, 2, 4, ... (at most 30) seconds until `patience_s` has passed; what fails for
another reason ("Invalid job id") is answered at once. Once a call has waited out its patience,
the command's later calls are tried once each until one is answered (a controller that is down
is said so in seconds, not after every call's own wait)."""

from __future__ import annotations

import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

BURST = 30  # slurmctld's own default bucket (rl_bucket_size): a command's first 30 calls go at once
QUERIES_PER_MIN = 30.0  # the default of cluster.queries_per_min: one every 2 s once the burst is spent
MAX_BACKOFF_S = 30.0
MISSING, TIMED_OUT = -1, -2  # Answer.code when the command is not installed / did not answer in time

# what SLURM's clients print when the daemon they ask is busy, restarting or limiting RPCs (lower case)
TRANSIENT = (
    "socket timed out",
    "unable to contact slurm controller",
    "connection refused",
    "connection timed out",
    "zero bytes were transmitted",
    "rate limit",
    "too many rpc",
    "resource temporarily unavailable",
    "slurmdbd is not running",
    "problem talking to the database",
    "slurm backup controller in standby mode",
)
# of those, the refusals that say a submission was not accepted (after "Socket timed out" an sbatch
# may have been: submitting again could queue the job twice)
NOT_SUBMITTED = ("unable to contact slurm controller", "connection refused", "rate limit", "too many rpc")


@dataclass(frozen=True)
class Answer:
    code: int  # the exit status, MISSING or TIMED_OUT
    out: str
    err: str

    @property
    def ok(self) -> bool:
        return self.code == 0

    @property
    def busy(self) -> bool:
        """Asked at a bad moment: the same question may be answered later."""
        return self.code == TIMED_OUT or (self.code > 0 and busy_words(self.err, TRANSIENT))

    def why(self) -> str:
        if self.code == MISSING:
            return "not installed"
        if self.code == TIMED_OUT:
            return "no answer in time"
        return " ".join(self.err.split())[:300] or f"exit status {self.code}"


Runner = Callable[[Sequence[str], float], Answer]


def busy_words(text: str, words: Sequence[str]) -> bool:
    low = text.lower()
    return any(w in low for w in words)


def run_command(argv: Sequence[str], timeout_s: float) -> Answer:
    try:
        r = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s)
    except OSError as e:
        return Answer(MISSING, "", str(e))
    except subprocess.TimeoutExpired:
        return Answer(TIMED_OUT, "", f"{argv[0]} did not answer within {timeout_s:.0f} s")
    return Answer(r.returncode, r.stdout, r.stderr)


@dataclass
class Scheduler:
    queries_per_min: float = QUERIES_PER_MIN
    burst: int = BURST
    runner: Runner = run_command
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    counts: Counter[str] = field(default_factory=Counter)  # calls made, by command (sbatch, squeue, ...)
    retried: int = 0  # calls asked again because the daemon was busy
    _tokens: float | None = None
    _at: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock)  # a sweep's limits are read by 4 threads
    unanswered: bool = False  # a call spent its patience on a busy daemon, and none answered since

    def ask(
        self,
        argv: Sequence[str],
        timeout_s: float = 60,
        patience_s: float = 15,
        again: Sequence[str] = (),
        runner: Runner | None = None,
    ) -> Answer:
        """The command's answer; a busy daemon's refusal is asked again with back-off for up to
        `patience_s` seconds, and its last refusal is the answer after that. `again`: only these
        refusals are asked again (a submission: NOT_SUBMITTED). `runner`: how this one command
        runs, when another library runs it (submitit's sbatch), else this door's own."""
        start, backoff = self.clock(), 1.0
        if self.unanswered:  # waited out once in this command already: one try, not another wait
            patience_s = 0
        while True:
            self.charge(argv[0])
            answer = (runner or self.runner)(argv, timeout_s)
            retry = busy_words(answer.err, again) if again else answer.busy
            if not retry or self.clock() + backoff - start > patience_s:
                self.unanswered = retry and patience_s > 0 or (self.unanswered and not answer.ok)
                return answer
            self.retried += 1
            self.sleep(backoff)
            backoff = min(MAX_BACKOFF_S, 2 * backoff)

    def charge(self, command: str) -> None:
        """Count one call of `command` (also those another library makes: submitit's sbatch)
        and hold it to the rate."""
        with self._lock:
            self._take()
            self.counts[command.rsplit("/", 1)[-1]] += 1

    def _take(self) -> None:
        """One token of the bucket, waiting for it when the burst is spent."""
        now = self.clock()
        rate = self.queries_per_min / 60.0
        tokens = (
            self.burst if self._tokens is None else min(self.burst, self._tokens + (now - self._at) * rate)
        )
        if tokens < 1:
            self.sleep((1 - tokens) / rate)
            now, tokens = self.clock(), 1.0
        self._tokens, self._at = tokens - 1, now

    @property
    def total(self) -> int:
        return sum(self.counts.values())


SCHEDULER = Scheduler()


def configure(queries_per_min: float) -> None:
    """This process's rate (cluster.queries_per_min of the config it runs)."""
    SCHEDULER.queries_per_min = queries_per_min


def keep_under(cluster_rpc_per_min: float | None) -> None:
    """Half the controller's own per-user RPC limit, where it has one (limits.parse_rpc_limit),
    when that is less than the configured rate: the user's other commands get the other half."""
    if cluster_rpc_per_min is not None:
        SCHEDULER.queries_per_min = min(SCHEDULER.queries_per_min, cluster_rpc_per_min / 2)


def ask(
    argv: Sequence[str],
    timeout_s: float = 60,
    patience_s: float = 15,
    again: Sequence[str] = (),
    runner: Runner | None = None,
) -> Answer:
    return SCHEDULER.ask(argv, timeout_s, patience_s, again, runner)


def query(argv: Sequence[str], timeout_s: float = 60, patience_s: float = 15) -> str | None:
    """A query's output, or None when it cannot be answered (callers fall back to what they know)."""
    answer = ask(argv, timeout_s, patience_s)
    return answer.out if answer.ok else None
