"""A rank's steps file (steps-rank{R}.jsonl), written in batches: a line per step, handed to the
kernel once FLUSH_S have passed since the last hand-off (status and the watchdog's readers see
progress within that), before a checkpoint and at the end, instead of a write system call every
step (a line-buffered file's), which a step of under a millisecond pays for (issue 74). A rank
killed outright loses at most FLUSH_S of step records; the file never holds a partial line that
readers would not skip (records.iter_steps)."""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType

from hpctrain import records

FLUSH_S = 0.25


class StepLog:
    def __init__(self, path: Path) -> None:
        self.file = open(path, "w", buffering=1 << 16)  # noqa: SIM115 - closed by __exit__
        self.flushed = time.monotonic()

    def add(self, recs: Iterable[records.StepRecord]) -> None:
        self.file.writelines(records.step_line(r) for r in recs)
        now = time.monotonic()
        if now - self.flushed >= FLUSH_S:
            self.flush(now)

    def flush(self, now: float | None = None) -> None:
        self.file.flush()
        self.flushed = time.monotonic() if now is None else now

    def __enter__(self) -> StepLog:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.file.close()  # flushes what is buffered, also when the steps end in an error
