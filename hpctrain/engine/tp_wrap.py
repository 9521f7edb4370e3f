"""Tensor parallelism on the ranks: a plan (config/tp_plan.py: module name -> style) applied to
the model with torch.distributed.tensor.parallel over the mesh's "tp" dimension. Each split
module's parameters become DTensors holding this rank's slice; the rest stay whole on every rank
of the group, where their gradients come out the same because their inputs are the same.

Sequence parallelism (Korthikanti et al. 2022) keeps the residual stream split along the sequence
between the split regions: the norms run on a slice (SequenceParallel), each region gathers its
input (PrepareModuleInput) and reduce-scatters its output (RowwiseParallel to Shard(1)).
"""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from hpctrain.config.tp_plan import SPLITS, resolve


class TensorParallelError(RuntimeError):
    """A plan that does not fit the model: a pattern naming nothing, or a module it cannot split."""


SPLITTABLE = (nn.Linear, nn.Embedding)


def style_for(style: str, module: nn.Module, sequence: bool) -> ParallelStyle:
    """torch's ParallelStyle for one module of the plan (config/tp_plan.py names them)."""
    seq = Shard(1)  # activations are [batch, sequence, features]
    if style == "sequence":
        return SequenceParallel()
    if style == "gather_input":
        return PrepareModuleInput(input_layouts=(seq,), desired_input_layouts=(Replicate(),))
    if style == "split_output":
        return PrepareModuleOutput(output_layouts=Replicate(), desired_output_layouts=seq)
    if style == "rowwise" and isinstance(module, nn.Embedding):
        # a split vocabulary's rows all-reduced whole: what follows (a position embedding) adds
        # to the whole sequence; split_output cuts it afterwards
        return RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())
    if style == "rowwise":
        return RowwiseParallel(output_layouts=seq if sequence else Replicate())
    if style == "colwise_gather":
        return ColwiseParallel(input_layouts=seq if sequence else Replicate(), output_layouts=Replicate())
    return ColwiseParallel()


def split_model(model: nn.Module, tp_mesh: Any, plan: dict[str, str], sequence: bool) -> nn.Module:
    """`model`, split in place by `plan` (patterns over module names)."""
    modules = dict(model.named_modules())
    names = check_plan(model, plan)
    parallelize_module(model, tp_mesh, {n: style_for(s, modules[n], sequence) for n, s in names.items()})
    return model


def check_plan(model: nn.Module, plan: dict[str, str]) -> dict[str, str]:
    """The module names the plan's patterns match, with their styles; TensorParallelError for a
    pattern that matches nothing or a split style on a module that is not a Linear or Embedding."""
    modules = dict(model.named_modules())
    names, unmatched = resolve(plan, [n for n in modules if n])
    if unmatched:
        raise TensorParallelError(
            f"parallelism.tp.plan: {unmatched} name no module of the model; its modules: "
            f"{', '.join(n for n in modules if n and n.count('.') < 2)}"
        )
    wrong = {
        n: type(modules[n]).__name__
        for n, style in names.items()
        if style in SPLITS and not isinstance(modules[n], SPLITTABLE)
    }
    if wrong:
        raise TensorParallelError(
            f"parallelism.tp.plan: {wrong} are not Linear or Embedding modules, which are what "
            "tensor parallelism splits; name the Linear layers inside them"
        )
    return names
