"""One live writer per study or tune directory: a second `study resume` or `tune --resume` while
the first still runs would rename the trials and runs the first is writing to, and both would run
at once. flock, so the kernel releases the lock when its holder dies, however it dies."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from hpctrain.errors import HpctrainError

LOCK = ".lock"  # in a study or tune directory: held by the hpctrain running it, naming its pid


@contextmanager
def writer_lock(home: Path, what: str, resume: str) -> Iterator[None]:
    """Hold `home`'s lock while its runs are written; HpctrainError naming the holder's pid if
    another hpctrain holds it (`what`: study, tune; `resume`: the command to go on with)."""
    # close-on-exec (Python's default, said here): a step's srun never holds the lock after the
    # driver dies, so the kernel frees it with the driver (tests/reliability/test_concurrency.py)
    fd = os.open(home / LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise HpctrainError(
            f"{what} {home} is being run by another hpctrain (pid {holder}); wait for it to end, "
            f"or stop it, then: {resume}"
        ) from None
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield
    finally:
        os.close(fd)
