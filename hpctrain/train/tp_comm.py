"""What tensor parallelism sends in a step, counted on one warm-up step: every collective that
DTensor issues for the split layers (all-reduces after row-wise layers and of column-wise layers'
input gradients; all-gathers and reduce-scatters with sequence parallelism), with its size.

torch's CommDebugMode (torch.distributed.tensor.debug) sees each collective as DTensor desugars
into functional collectives (`_c10d_functional::*`); this mode also adds up their bytes. FSDP's own
all-gathers and reduce-scatters go through the process group (`c10d::*`) and are not counted here:
the gradient roofline counts them. The sizes are a whole message's, m, as the alpha-beta model takes
them (analysis/model.py): an all-reduce's buffer, an all-gather's output, a reduce-scatter's input.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.distributed.tensor.debug import CommDebugMode

# the functional collectives DTensor issues, and what of each call is a whole message (m)
WHOLE = {"all_reduce": "input", "all_gather_into_tensor": "output", "reduce_scatter_tensor": "input"}
# bytes on the wire of a ring, in units of an all-reduce's 2 (n-1)/n m: all-gather and
# reduce-scatter move (n-1)/n m each (Thakur et al. 2005)
ALLREDUCE_SHARE = {"all_reduce": 1.0, "all_gather_into_tensor": 0.5, "reduce_scatter_tensor": 0.5}


@dataclass(frozen=True)
class TpTraffic:
    """One step's tensor-parallel collectives on one rank."""

    counts: dict[str, int] = field(default_factory=dict)  # collective -> calls
    bytes: dict[str, int] = field(default_factory=dict)  # collective -> whole-message bytes, summed

    @property
    def messages(self) -> int:
        return sum(self.counts.values())

    @property
    def allreduce_bytes(self) -> float:
        """The bytes an all-reduce would have to carry to put as much on the wire."""
        return sum(ALLREDUCE_SHARE.get(k, 1.0) * b for k, b in self.bytes.items())


class CollectiveLog(CommDebugMode):
    """CommDebugMode that also adds up the bytes of each functional collective."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: Counter[str] = Counter()
        self.sizes: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = super().__torch_dispatch__(func, types, args, kwargs)
        if out is NotImplemented or isinstance(func, torch._ops.HigherOrderOperator):
            return out
        name = str(func._schema.name)
        kind = name.split("::", 1)[1] if name.startswith("_c10d_functional::") else ""
        if kind in WHOLE:
            tensor = out if WHOLE[kind] == "output" else args[0]
            self.calls[kind] += 1
            self.sizes[kind] += tensor.numel() * tensor.element_size()
        return out

    def traffic(self) -> TpTraffic:
        return TpTraffic(dict(self.calls), dict(self.sizes))
