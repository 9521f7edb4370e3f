"""The overhead benchmark's reading of its minimal scripts' output."""

from __future__ import annotations

import pytest

from hpctrain.bench.minimal import throughput


def test_throughput_is_set_by_the_slowest_process_even_from_interleaved_output() -> None:
    # two processes wrote to one pipe at once: the records are glued, not on lines of their own
    out = 'noise\n{"rank": 1, "size": 2, "timed_s": 2.0}{"rank": 0, "size": 2, "timed_s": 1.5}\n'
    assert throughput(out, batch=64, steps=60, warmup=10) == pytest.approx(64 * 2 * 50 / 2.0)
    with pytest.raises(ValueError, match="1 of 2 processes reported"):
        throughput('{"rank": 0, "size": 2, "timed_s": 1.5}', 64, 60, 10)
