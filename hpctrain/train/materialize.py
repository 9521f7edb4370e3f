"""Building a model no rank holds whole: on the meta device (no memory), split and sharded there,
then each rank's slices allocated on its device and filled with exactly the weights one rank
would have drawn (TorchTitan's order, meta -> parallelize -> to_empty -> init, with the one-rank
initial weights kept, so N ranks still equal one rank bit for bit at step 0).

One rank draws its initial weights module by module as it constructs them (each module's
reset_parameters, from the global CPU generator after train.seed). Here each module's own
parameters are drawn again, the same way and in the same order, into a full-size copy of that one
module, and every rank keeps its slice of it (distribute_tensor from a full tensor each rank holds
alike: no communication). At most one module is whole at a time.

Only the built-in models are built this way: their modules all draw in reset_parameters (Linear,
Embedding, LayerNorm, Conv2d, BatchNorm2d, and the transformer's Embed). A user model may draw in
its constructor in ways nothing can replay, so it is built whole, as before.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import nn


@dataclass
class Deferred:
    """A model built on the meta device, and how to draw its weights again."""

    rng_state: torch.Tensor  # the CPU generator's state where one rank began drawing the model
    own: list[tuple[nn.Module, nn.Module]]  # (module, a childless copy holding its own tensors)


def _own_tensors(m: nn.Module) -> bool:
    return bool(m._parameters or m._buffers)


def _childless(m: nn.Module) -> nn.Module:
    """`m` without its children, its own parameters and buffers in dictionaries of its own."""
    c = copy.copy(m)
    c._modules = {}
    c._parameters = dict(m._parameters)
    c._buffers = dict(m._buffers)
    return c


def replayable(model: nn.Module) -> bool:
    """Every module that holds tensors draws them in reset_parameters, and no tensor is held by
    two modules (a tied head: the value one rank keeps is the last assignment's, not the last
    draw's, and a split or sharded copy of each module would untie it)."""
    held = [id(p) for m in model.modules() for p in m._parameters.values() if p is not None]
    return len(held) == len(set(held)) and all(
        hasattr(m, "reset_parameters") for m in model.modules() if _own_tensors(m)
    )


def defer(build: nn.Module, rng_state: torch.Tensor) -> Deferred:
    """Remember how to draw `build` (on the meta device), and advance the CPU generator as far as
    drawing it would have: what is made after the model (a user's dataset) sees the same stream."""
    deferred = Deferred(rng_state, [(m, _childless(m)) for m in build.modules() if _own_tensors(m)])
    for _ in _drawn(deferred):
        pass
    return deferred


def _drawn(d: Deferred) -> Iterator[tuple[nn.Module, nn.Module]]:
    """Each module with its own tensors drawn whole on the CPU, in construction order."""
    for m, c in d.own:
        whole = copy.copy(c)
        whole._parameters = {
            k: None if p is None else nn.Parameter(torch.empty_like(p, device="cpu"))
            for k, p in c._parameters.items()
        }
        whole._buffers = {
            k: None if b is None else torch.empty_like(b, device="cpu") for k, b in c._buffers.items()
        }
        cast(Any, whole).reset_parameters()  # replayable() checked it has one
        yield m, whole


@torch.no_grad()
def materialize(model: nn.Module, d: Deferred, device: torch.device) -> None:
    """Allocate this rank's slices on `device` and fill them with the one-rank weights."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    model.to_empty(device=device)
    after = torch.get_rng_state()
    torch.set_rng_state(d.rng_state)
    try:
        for m, whole in _drawn(d):
            sources = {
                **dict(whole.named_parameters(recurse=False)),
                **dict(whole.named_buffers(recurse=False)),
            }
            targets = {**dict(m.named_parameters(recurse=False)), **dict(m.named_buffers(recurse=False))}
            for name, t in targets.items():
                if t.is_meta:  # a module this rank does not hold (another pipeline stage's)
                    continue
                full = sources[name].to(device)
                if isinstance(t, DTensor):
                    full = distribute_tensor(full, t.device_mesh, t.placements, src_data_rank=None)
                t.copy_(full)
    finally:
        torch.set_rng_state(after)  # the stream goes on as it would have after one rank's build
