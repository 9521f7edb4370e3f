"""Tied parameters: one tensor under several names, as a language model's output head shares the
token embedding's weight (GPT-2's `lm_head.weight = wte.weight`, model.tie_embeddings). One rank
updates it once with the sum of both uses' gradients; every layout must do the same or refuse.

- data parallelism: the wrappers see the model's parameters once each (nothing to do);
- tensor parallelism splits each module's parameters into new ones: `retie` points every name at
  one of them again, where the placements agree (a vocabulary split by rows in the embedding and
  by output features in the head: both Shard(0)), and refuses otherwise;
- FSDP2 keeps a parameter shared within one unit (it sets the shard on every module holding it):
  `check_units` refuses a tie that units would cut apart;
- pipelines hold a copy on each stage that uses it: `PipelineTies` sums the copies' gradients
  over the ranks holding them after the backward pass, so the copies stay equal (Megatron-LM's
  embedding group, Shoeybi et al. 2019).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from hpctrain.errors import HpctrainError
from hpctrain.records import Layout

Tie = tuple[str, ...]  # the names of one tied tensor, in the model's order
WRAPPED = "_checkpoint_wrapped_module."  # what torch's checkpoint_wrapper puts into names


class TieError(HpctrainError):
    """A layout that would untie a tied parameter (the message names it, the rule and the fix)."""


def tied_groups(model: nn.Module) -> list[Tie]:
    """The model's tied parameters: each tensor held under more than one name, with its names."""
    names: dict[int, list[str]] = defaultdict(list)
    for name, p in model.named_parameters(remove_duplicate=False):
        names[id(p)].append(name)
    return [tuple(n) for n in names.values() if len(n) > 1]


def _split(name: str) -> tuple[str, str]:
    owner, _, attr = name.rpartition(".")
    return owner, attr


def _local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local slice (the tensor itself otherwise)."""
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def _as_placed(p: nn.Parameter) -> None:
    """p.grad in its parameter's placement: a split embedding's comes back Partial or Replicate
    (the optimizer redistributes it on its own; the copies' slices are summed here)."""
    from torch.distributed.tensor import DTensor

    g = p.grad
    if isinstance(g, DTensor) and isinstance(p, DTensor) and tuple(g.placements) != tuple(p.placements):
        p.grad = g.redistribute(p.device_mesh, p.placements)


def _layout(p: torch.Tensor) -> tuple[Any, ...]:
    """What must agree for two parameters to be one: global shape, and placements and mesh."""
    placements = getattr(p, "placements", None)
    mesh = getattr(p, "device_mesh", None)
    return (tuple(p.shape), tuple(placements) if placements else None, id(mesh) if mesh else None)


def retie(model: nn.Module, ties: Iterable[Tie], why: str) -> None:
    """Every name of each tie that `model` holds points at one parameter again, after a wrapper
    replaced them one module at a time (`why`: the layout, for the refusal). TieError where the
    copies differ in shape or placement: they could not be one tensor."""
    modules = dict(model.named_modules())
    for tie in ties:
        held = [n for n in tie if _split(n)[0] in modules and hasattr(modules[_split(n)[0]], _split(n)[1])]
        params = {n: getattr(modules[_split(n)[0]], _split(n)[1]) for n in held}
        if len({id(p) for p in params.values()}) < 2:
            continue
        layouts = {n: _layout(p) for n, p in params.items()}
        if len(set(layouts.values())) > 1:
            raise TieError(
                f"{why} splits the tied parameters {', '.join(held)} (one tensor) differently: "
                + "; ".join(f"{n} {_placed(p)}" for n, p in params.items())
                + ". Split their modules alike (a vocabulary split: the embedding rowwise and the head "
                "colwise or colwise_gather), or neither; or untie them"
            )
        first = params[held[0]]
        for n in held[1:]:
            owner, attr = _split(n)
            setattr(modules[owner], attr, first)


def _placed(p: torch.Tensor) -> str:
    placements = getattr(p, "placements", None)
    return f"{tuple(p.shape)} {list(map(str, placements)) if placements else 'whole'}"


def unit_of(name: str, units: list[str]) -> str:
    """The FSDP unit holding parameter `name`: the deepest unit module above it ('' the root)."""
    owners = [u for u in units if name.startswith(u + ".")]
    return max(owners, key=len) if owners else ""


def check_units(model: nn.Module, units: list[str]) -> None:
    """TieError for a tie of `model` whose names fall in different FSDP units (`units`, as
    parallelism.shard.modules names them): each unit would shard its own copy, updated with part
    of the gradient."""
    from hpctrain.engine.fsdp_wrap import find_units

    found = find_units(model, units) if units else []
    names = [n for n, m in model.named_modules() if n and any(m is u for u in found)]
    for tie in tied_groups(model):
        where = {n: unit_of(n, names) or "the root" for n in tie}
        if len(set(where.values())) > 1:
            raise TieError(
                "parallelism.shard.modules: the tied parameters "
                + ", ".join(f"{n} (unit {u})" for n, u in where.items())
                + " are one tensor in different units, which would shard a copy each; keep them in one "
                "unit: leave their modules (or a module above both) out of parallelism.shard.modules"
            )


@dataclass
class PipelineTies:
    """This rank's copies of the ties that span pipeline pieces, each with the process group of
    the ranks holding a copy in its pipeline (None: all copies on this rank)."""

    groups: list[tuple[list[nn.Parameter], Any]] = field(default_factory=list)

    def sum_grads(self) -> None:
        """Every copy's gradient becomes the sum of all copies' (after the replicas averaged
        theirs): each copy then takes the update one rank makes to the tensor."""
        import torch.distributed as dist

        for copies, group in self.groups:
            for p in copies:
                _as_placed(p)
            locals_ = [_local(p.grad) for p in copies if p.grad is not None]
            total = sum(locals_[1:], locals_[0].clone()) if locals_ else torch.zeros_like(_local(copies[0]))
            if group is not None:
                dist.all_reduce(total, group=group)
            for p in copies:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                _local(p.grad).copy_(total)


def pipeline_ties(
    ties: list[Tie], piece_names: list[set[str]], mine: dict[int, nn.Module], layout: Layout, rank: int
) -> PipelineTies:
    """The ties whose names fall in more than one piece. `piece_names`: every piece's parameter
    names (every rank knows them all: it cut the whole model); `mine`: this rank's pieces by
    index, as they were cut (not yet wrapped: their names are the whole model's). Every rank
    creates every pipeline's group, in the same order, as torch.distributed.new_group requires."""
    import torch.distributed as dist

    out = PipelineTies()
    pipelines = [  # one per replica, position along the named dimensions and tensor-parallel rank
        layout.pipeline_ranks(r, t, i)
        for r in range(layout.replicas)
        for i in range(layout.inner)
        for t in range(layout.tp)
    ]
    for tie in ties:
        pieces = [k for k, names in enumerate(piece_names) if names & set(tie)]
        if len(pieces) < 2:
            continue
        group = None
        for ranks in pipelines:
            holders = sorted({r for r in ranks for k in pieces if k in layout.pieces_of(r)})
            made = dist.new_group(holders) if len(holders) > 1 else None
            if rank in ranks:
                group = made
        copies: dict[int, nn.Parameter] = {}
        for module in mine.values():
            for name, p in module.named_parameters(remove_duplicate=False):
                if name.replace(WRAPPED, "") in tie:  # a block wrapped for checkpointing
                    copies.setdefault(id(p), p)
        if copies:
            out.groups.append((list(copies.values()), group))
    return out
