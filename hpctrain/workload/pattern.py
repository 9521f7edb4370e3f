"""script.throughput_regex, matched in linear time: Google's RE2 (google-re2) instead of Python's
backtracking `re`, so a pattern like `(a+)+$` cannot spin rank 0's output reader on a long line.
RE2 has no back-references or look-around; such patterns are refused before the run starts."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import re2


class PatternError(ValueError):
    """The pattern does not compile, or RE2 cannot run it in linear time."""


def compile_pattern(text: str) -> Any:
    """The compiled pattern (re2), or PatternError saying why not."""
    try:
        re.compile(text)  # Python's messages name the position of a syntax error
    except re.error as e:
        raise PatternError(f"is not a regular expression: {e}") from e
    try:
        with _quiet_stderr():  # RE2 logs its own parse error to fd 2 as well
            return re2.compile(text)
    except re2.error as e:
        why = e.args[0].decode(errors="replace") if e.args and isinstance(e.args[0], bytes) else str(e)
        raise PatternError(
            f"uses what a linear-time matcher (RE2) cannot run: {why} (back-references and "
            "look-around are not supported)"
        ) from e


@contextmanager
def _quiet_stderr() -> Iterator[None]:
    try:
        saved = os.dup(2)
    except OSError:  # no fd 2: nothing to quieten
        yield
        return
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
