"""A job's state in one vocabulary for every launcher: SLURM's words (its job state codes, as
squeue and sacct print them), of which the local launcher uses PENDING, RUNNING, COMPLETED,
FAILED and CANCELLED. Each scheduler's words become a State in one place (State.of), and code
compares States, never bare strings. A StrEnum: a State is its word, in state.json and on screen."""

from __future__ import annotations

from enum import StrEnum


class State(StrEnum):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    TIMEOUT = "TIMEOUT"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"
    NODE_FAIL = "NODE_FAIL"
    PREEMPTED = "PREEMPTED"
    BOOT_FAIL = "BOOT_FAIL"
    DEADLINE = "DEADLINE"
    # SLURM's passing states: the job is in the queue or on its nodes and not done
    CONFIGURING = "CONFIGURING"
    COMPLETING = "COMPLETING"
    REQUEUED = "REQUEUED"
    REQUEUE_FED = "REQUEUE_FED"
    REQUEUE_HOLD = "REQUEUE_HOLD"
    RESIZING = "RESIZING"
    RESV_DEL_HOLD = "RESV_DEL_HOLD"
    REVOKED = "REVOKED"
    SIGNALING = "SIGNALING"
    SPECIAL_EXIT = "SPECIAL_EXIT"
    STAGE_OUT = "STAGE_OUT"
    STOPPED = "STOPPED"
    SUSPENDED = "SUSPENDED"
    # hpctrain's own: the job left SLURM's queue while accounting could not say how (the run's
    # records tell); and a word no scheduler should print
    ENDED = "ENDED"
    UNKNOWN = "UNKNOWN"

    @classmethod
    def of(cls, word: str) -> State:
        """A scheduler's word as a State: sacct's "CANCELLED by 0" is CANCELLED; an unknown word
        is UNKNOWN (not done: the job is asked again)."""
        first = word.split()[0] if word.strip() else ""
        return cls.__members__.get(first, cls.UNKNOWN)

    @property
    def done(self) -> bool:
        return self in DONE

    @property
    def live(self) -> bool:
        """Waiting to start or running (what tracking follows)."""
        return self in (State.PENDING, State.RUNNING)


# a job is done in any of these states
DONE = frozenset(
    {
        State.COMPLETED,
        State.FAILED,
        State.CANCELLED,
        State.TIMEOUT,
        State.OUT_OF_MEMORY,
        State.NODE_FAIL,
        State.PREEMPTED,
        State.BOOT_FAIL,
        State.DEADLINE,
        State.ENDED,
    }
)
