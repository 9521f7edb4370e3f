"""Where torch.distributed's ranks meet (MASTER_ADDR:MASTER_PORT), bounded in time. torch waits
30 minutes for ranks that never arrive, or for a store it cannot reach, printing C++ frames, and
the stall watchdog only watches steps: a rank stopped before it joined, or a store nobody answers
at, held the run for half an hour. Here the meeting takes at most the stall timeout, and its
failure says who never came, or where a rank could not get to."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from hpctrain.engine.world import CommError

JOINED = "hpctrain/joined/"  # a key each rank sets in the store once it is there


class RendezvousError(CommError):
    """The ranks did not all meet in time."""

    quiet = True  # the message says who and where; the rank's stack would not


def meet(seconds: float, env: Mapping[str, str] = os.environ) -> Any:
    """The TCPStore the default process group is built on, once every rank has joined it; rank 0
    hosts it. RendezvousError after `seconds` naming the ranks that never joined (rank 0), or the
    address a rank could not reach (any other rank)."""
    import torch.distributed as dist

    rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
    where = f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}"
    limit = f"within {seconds:g} s (train.stall_timeout_s)"
    try:
        store = dist.TCPStore(
            env["MASTER_ADDR"], int(env["MASTER_PORT"]), world, rank == 0,
            timeout=timedelta(seconds=seconds), wait_for_workers=False,
        )  # fmt: skip
        store.set(f"{JOINED}{rank}", "1")
    except (RuntimeError, ValueError) as e:  # torch's DistError and its network errors are RuntimeErrors
        what = str(e).strip().splitlines()[0][:300]
        said = (
            f"host the ranks' meeting point {where}"
            if rank == 0
            else f"reach the ranks' meeting point {where} {limit}"
        )
        raise RendezvousError(f"rank {rank} could not {said}: {what}") from None
    if rank == 0:
        deadline = time.monotonic() + seconds
        while missing := [r for r in range(world) if not store.check([f"{JOINED}{r}"])]:
            if time.monotonic() > deadline:
                raise RendezvousError(
                    f"rank(s) {', '.join(map(str, missing))} of {world} never joined the ranks' meeting "
                    f"point {where} {limit}; rank 0 waited there"
                )
            time.sleep(0.05)
    return store
