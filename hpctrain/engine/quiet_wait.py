"""Waiting for Horovod's collectives without spinning a core.

Horovod's `synchronize(handle)` loops on `sched_yield()` until the background thread marks the
handle done (horovod/horovod#2101 replaced a 1 ms sleep with it, for latency). A rank that waits
long, for a straggler, a slow peer's backward pass or a stalled rank, then keeps one core fully
busy in the kernel: measured here, rank 0's main thread at 100 % system time for the whole of a
peer's stall, beside Horovod's own background thread that is doing the allreduce. When ranks and
threads fill the cores, as they do on a CPU node, that core is taken from the compute and from
the very collective being waited for.

So the engine polls first (`hvd.poll`, which never blocks): a short spin for the collectives that
finish at once, then sleeps that double from 50 µs to 2 ms, and calls `synchronize` only once
every handle is done, when it returns at once. A long wait costs at most 2 ms of latency more; a
short one nothing.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from typing import Any

SPIN_S = 1e-3  # yield-polling this long first: the waits that end at once stay as fast
FIRST_SLEEP_S = 5e-5
MAX_SLEEP_S = 2e-3


def wait_quietly(
    handles: Iterable[Any],
    poll: Callable[[Any], bool],
    clock: Callable[[], float] = time.perf_counter,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Return once `poll` is true of every handle; the number of sleeps it took (0 when the
    spin sufficed). Handles that are None (not started) are skipped."""
    pending = [h for h in handles if h is not None]
    start, pause, sleeps = clock(), FIRST_SLEEP_S, 0
    while pending:
        pending = [h for h in pending if not poll(h)]
        if not pending:
            break
        if clock() - start < SPIN_S:
            os.sched_yield()
            continue
        sleep(pause)
        sleeps += 1
        pause = min(2 * pause, MAX_SLEEP_S)
    return sleeps


def optimizer_handles(optimizer: Any) -> list[Any]:
    """The gradient allreduces a Horovod DistributedOptimizer has started (its `_handles`: the
    parameter, or a group of them, to (handle, context); a handle is None until started)."""
    return [entry[0] for entry in getattr(optimizer, "_handles", {}).values()]
