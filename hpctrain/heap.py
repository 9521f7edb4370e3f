"""A rank's cyclic garbage collector during its start.

Importing torch allocates some 300,000 tracked objects (450,000 with torch._dynamo, which DDP,
FSDP and torch.export import), and with the collector on each full collection scans all of them
again: a sixth of a Horovod rank's start and a fifth of a DDP rank's on a 2-core machine
(`hpctrain bench startup`). So a rank holds the collector off while it imports and builds its
trainer, then freezes what exists (gc.freeze: later collections skip it, which also keeps them
short during training) and turns the collector back on for training and for the user's script.
The start's own cyclic garbage (some 9,000 objects) is frozen with the rest rather than freed by
a full collection that would cost 0.1 to 0.2 s.
"""

from __future__ import annotations

import gc

_held = False


def hold() -> None:
    """The collector off until release(); first thing in a rank's process."""
    global _held
    if gc.isenabled():
        gc.disable()
        _held = True


def release() -> None:
    """The start's objects frozen and the collector on again, if hold() turned it off; idempotent."""
    global _held
    if _held:
        gc.freeze()
        gc.enable()
        _held = False
