"""A rank's steps file (steps-rank{R}.jsonl): a line per step, each handed to the kernel as it is
written (a line-buffered file: one write system call a step). Batching them would save that call
on a step of under a millisecond, but a rank killed by a signal (its peer failed, the launcher
stopped the run, SLURM preempted it) would lose the records still in its buffer, and status and
the tests that follow a run read progress from this file as it grows (measured: 12 of the suite's
tests failed with a quarter second's batches). The file never holds a partial line that readers
would not skip (records.iter_steps)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from types import TracebackType

from hpctrain import records


class StepLog:
    def __init__(self, path: Path) -> None:
        self.file = open(path, "w", buffering=1)  # noqa: SIM115 - closed by __exit__

    def add(self, recs: Iterable[records.StepRecord]) -> None:
        self.file.writelines(records.step_line(r) for r in recs)

    def flush(self) -> None:
        self.file.flush()

    def __enter__(self) -> StepLog:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.file.close()
