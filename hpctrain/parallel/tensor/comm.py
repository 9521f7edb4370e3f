"""What tensor parallelism sends in a step, counted on one warm-up step: every collective that
DTensor issues for the split layers (all-reduces after row-wise layers and of column-wise layers'
input gradients; all-gathers and reduce-scatters with sequence parallelism), with its size.

torch's CommDebugMode (torch.distributed.tensor.debug) sees each collective as DTensor desugars
into functional collectives (`_c10d_functional::*`); this mode also adds up their bytes. FSDP's own
all-gathers and reduce-scatters go through the process group (`c10d::*`) and are not counted here:
the gradient roofline counts them. The sizes are a whole message's, m, as the alpha-beta model takes
them (analysis/model.py): an all-reduce's buffer, an all-gather's output, a reduce-scatter's input.

They run between the layers that need their results, so nothing hides them: all of their time is
exposed, but the step's clock cannot tell it from the compute around it (on a GPU they run on
another stream, inside the forward and backward passes). So after training `replay` times the
same messages on the same group, alone: what a step spends in them.
"""

from __future__ import annotations

import statistics
import time
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
    # (collective, whole-message elements, dtype name) -> calls: what `replay` sends again
    messages_by_shape: dict[tuple[str, int, str], int] = field(default_factory=dict)

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
        self.shapes: Counter[tuple[str, int, str]] = Counter()

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
            self.shapes[kind, tensor.numel(), str(tensor.dtype).removeprefix("torch.")] += 1
        return out

    def traffic(self) -> TpTraffic:
        return TpTraffic(dict(self.calls), dict(self.sizes), dict(self.shapes))


def replay(traffic: TpTraffic, group: Any, device: torch.device, repeats: int = 3) -> float:
    """Seconds one step spends in its tensor-parallel collectives: each message counted, sent
    again over the TP `group` with the same functional collective (median of `repeats`, after a
    warm-up), times its calls. Every rank of the group calls it with the same traffic (each
    counted the same step of the same split model)."""
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol

    n = dist.get_world_size(group)
    total = 0.0
    for (kind, numel, dtype), calls in sorted(traffic.messages_by_shape.items()):
        whole = torch.zeros(numel, dtype=getattr(torch, dtype), device=device)
        times = []
        for _ in range(repeats + 1):  # the first is a warm-up (the group's buffers)
            dist.barrier(group=group)
            t0 = time.perf_counter()
            funcol.wait_tensor(_send(kind, whole, n, group))
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            times.append(time.perf_counter() - t0)
        total += calls * statistics.median(times[1:])
    return total


def _send(kind: str, whole: torch.Tensor, n: int, group: Any) -> torch.Tensor:
    """One message of `kind` whose whole is `whole`, over `group` (of n ranks)."""
    import torch.distributed._functional_collectives as funcol

    if kind == "all_gather_into_tensor":  # each rank sends its 1/n; the whole is gathered
        gather = getattr(funcol, "all_gather_single", funcol.all_gather_tensor)  # renamed in torch 2.12
        return gather(whole[: max(1, whole.numel() // n)], 0, group)
    if kind == "reduce_scatter_tensor":  # the whole goes in; each rank keeps its 1/n
        return funcol.reduce_scatter_tensor(whole[: whole.numel() - whole.numel() % n], "sum", 0, group)
    return funcol.all_reduce(whole, "sum", group)
