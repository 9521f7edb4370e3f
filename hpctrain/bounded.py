"""Reading what users and run directories hand hpctrain, with a bound: a file named on the command
line or planted in a directory may be /dev/zero, a FIFO or gigabytes of garbage, and a login node
shared with other users must not run out of memory reading it. A file past its bound is refused
with TooLarge, an OSError, so that every reader's existing handling of unreadable files names it."""

from __future__ import annotations

import errno
import os
import stat

MiB = 1 << 20
RECORD = 256 * MiB  # a record of a run, sweep, study or tune directory (a 100,000-run study.json: ~30 MB)
TEXT = 16 * MiB  # a config.yaml, a script checked before it runs, a log's tail
SMALL = 1 * MiB  # an overrides file, a cache entry, a pointer
TRACE = 2048 * MiB  # a profiler trace (Chrome JSON of a profiled window)


class TooLarge(OSError):
    """The file holds more than hpctrain reads from a file of its kind."""

    def __init__(self, path: str | os.PathLike[str], limit: int) -> None:
        super().__init__(
            errno.EFBIG, f"holds more than the {limit / MiB:g} MiB hpctrain reads from such a file", str(path)
        )


def read_bytes(path: str | os.PathLike[str], limit: int) -> bytes:
    """At most `limit` bytes of the file; TooLarge past it. A FIFO or socket is refused rather than
    waited on (opening a FIFO blocks until someone writes)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or stat.S_ISDIR(mode):
            raise OSError(errno.EINVAL, "is not a regular file", str(path))
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise TooLarge(path, limit)
    return data


def read_text(path: str | os.PathLike[str], limit: int, errors: str = "strict") -> str:
    """The file as UTF-8 text, bounded as read_bytes (UnicodeDecodeError for invalid UTF-8 when
    `errors` is strict)."""
    return read_bytes(path, limit).decode("utf-8", errors)


def tail(path: str | os.PathLike[str], size: int) -> str:
    """The last `size` bytes of a file (a log), decoded leniently; its whole length is never read."""
    with open(path, "rb") as f:
        end = f.seek(0, os.SEEK_END)
        f.seek(max(0, end - size))
        return f.read(size).decode(errors="replace")
