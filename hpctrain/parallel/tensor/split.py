"""Tensor parallelism on the ranks: a plan (plan.py: module name -> style) applied to
the model with torch.distributed.tensor.parallel over the mesh's "tp" dimension. Each split
module's parameters become DTensors holding this rank's slice; the rest stay whole on every rank
of the group, where their gradients come out the same because their inputs are the same.

Sequence parallelism (Korthikanti et al. 2022) keeps the residual stream split along the sequence
between the split regions: the norms run on a slice (SequenceParallel), each region gathers its
input (PrepareModuleInput) and reduce-scatters its output (RowwiseParallel to Shard(1)).
"""

from __future__ import annotations

import fnmatch
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

from hpctrain.engine.ties import retie, tied_groups
from hpctrain.parallel.tensor.plan import fused_chunks, resolve, splits


class TensorParallelError(RuntimeError):
    """A plan that does not fit the model: a pattern naming nothing, or a module it cannot split."""


SPLITTABLE = (nn.Linear, nn.Embedding)
# what a user model's forward that fails once split most often lacks (said by the ranks' and the
# memory trace's one-sample check)
DIVIDE_HINT = (
    " (a forward that reads a head count or a width from an attribute needs it in "
    "parallelism.tp.divide, e.g. [h.*.attn.n_head,h.*.attn.n_embd]; docs: howto/tensor-parallel)"
)


class FusedColwiseParallel(ColwiseParallel):
    """Column-wise for a Linear whose output is `chunks` equal matrices side by side (a fused
    q/k/v projection): its weight and bias are split chunk by chunk (DTensor's _StridedShard, the
    placement FSDP2 x TP uses for the same layout), so a rank holds its columns of each and its
    output is [q_r, k_r, v_r]: what the module's own split by its (divided) width expects. The
    whole weight, gathered, is the model's as one rank has it (checkpoints, model.pt)."""

    def __init__(self, chunks: int, *, input_layouts: Any = None) -> None:
        super().__init__(input_layouts=input_layouts)
        self.chunks = chunks

    def _partition_linear_fn(self, name: str, module: nn.Module, device_mesh: Any) -> None:
        from torch.distributed.tensor import distribute_tensor
        from torch.distributed.tensor.placement_types import _StridedShard

        for pname, param in module.named_parameters():
            placed = distribute_tensor(
                param,
                device_mesh,
                [_StridedShard(0, split_factor=self.chunks)],
                src_data_rank=self.src_data_rank,
            )
            module.register_parameter(pname, nn.Parameter(placed, requires_grad=param.requires_grad))

    @staticmethod
    def _prepare_output_fn(
        output_layouts: Any, use_local_output: bool, mod: nn.Module, outputs: Any, device_mesh: Any
    ) -> Any:
        # the output's placement is the weight's, chunk by chunk on the last dimension: kept
        return outputs.to_local() if use_local_output else outputs


def style_for(style: str, module: nn.Module, sequence: bool) -> ParallelStyle:
    """torch's ParallelStyle for one module of the plan (plan.py names them)."""
    seq = Shard(1)  # activations are [batch, sequence, features]
    chunks = fused_chunks(style)
    if chunks is not None:
        return FusedColwiseParallel(chunks, input_layouts=seq if sequence else None)
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


def split_model(
    model: nn.Module, tp_mesh: Any, plan: dict[str, str], sequence: bool, divide: list[str] | None = None
) -> nn.Module:
    """`model`, split in place by `plan` (patterns over module names); the `divide` attributes
    (module.attribute patterns) divided by the group's size, as each rank's slice needs."""
    modules = dict(model.named_modules())
    names = check_plan(model, plan, tp_mesh.size(), divide or [])
    ties = tied_groups(model)
    parallelize_module(model, tp_mesh, {n: style_for(s, modules[n], sequence) for n, s in names.items()})
    retie(model, ties, "parallelism.tp.plan")  # parallelize_module made a parameter per module
    for owner, attr in divided(model, divide or []):
        setattr(owner, attr, getattr(owner, attr) // tp_mesh.size())
    return model


def piece_plan(plan: dict[str, str], divide: list[str], piece: nn.Module) -> tuple[dict[str, str], list[str]]:
    """The part of the tensor-parallel plan (patterns, resolved to module names) and of the
    `divide` attributes that falls within `piece` of a model cut into pipeline pieces (the plan
    was checked against the whole model at plan time)."""
    mine, _ = resolve(plan, [n for n, _ in piece.named_modules() if n])
    return mine, [a for a in divide if divided(piece, [a])]


def divided(model: nn.Module, divide: list[str]) -> list[tuple[nn.Module, str]]:
    """The (module, attribute) pairs the `divide` patterns name in `model` (a pattern naming no
    module here names one in another pipeline piece)."""
    modules = [(n, m) for n, m in model.named_modules() if n]
    out = []
    for pattern in divide:
        where, _, attr = pattern.rpartition(".")
        out += [(m, attr) for n, m in modules if fnmatch.fnmatchcase(n, where)]
    return out


def check_plan(
    model: nn.Module, plan: dict[str, str], degree: int = 1, divide: list[str] | None = None
) -> dict[str, str]:
    """The module names the plan's patterns match, with their styles; TensorParallelError for a
    pattern that matches nothing, a split style on a module that is not a Linear or Embedding, a
    dimension that does not split over `degree` ranks, or a `divide` attribute that is not a
    whole number the degree divides."""
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
        if splits(style) and not isinstance(modules[n], SPLITTABLE)
    }
    if wrong:
        raise TensorParallelError(
            f"parallelism.tp.plan: {wrong} are not Linear or Embedding modules, which are what "
            "tensor parallelism splits; name the Linear layers inside them"
        )
    unfit = [f"{n} ({why})" for n, style in names.items() if (why := _unfit(modules[n], style, degree))]
    if unfit:
        raise TensorParallelError(
            f"parallelism.tp.plan: {'; '.join(unfit)}: each rank's slice must be whole; use a degree "
            "that divides them, or leave those modules out of the plan"
        )
    _check_divide(model, divide or [], degree)
    _check_ties(model, names)
    return names


def _split_dim(module: nn.Module, style: str | None) -> str:
    """Which dimension of the module's weight the style splits ('whole' where none)."""
    if style is None or not splits(style):
        return "whole"
    if fused_chunks(style) is not None:
        return f"rows, in {fused_chunks(style)} chunks"
    embedding = isinstance(module, nn.Embedding)
    return "rows" if (style == "rowwise") == embedding else "columns"


def _check_ties(model: nn.Module, names: dict[str, str]) -> None:
    """A tied parameter stays one tensor only where the plan splits each of its modules' weights
    along the same dimension (split_model re-ties them after the split: engine/ties.py)."""
    modules = dict(model.named_modules())
    for tie in tied_groups(model):
        owners = {n: n.rpartition(".")[0] for n in tie}
        dims = {n: _split_dim(modules[o], names.get(o)) for n, o in owners.items()}
        if len(set(dims.values())) > 1:
            raise TensorParallelError(
                f"parallelism.tp.plan: the tied parameters {', '.join(tie)} (one tensor) would be split "
                f"differently ({'; '.join(f'{n}: {d}' for n, d in dims.items())}); split their modules "
                "alike (an embedding rowwise with its head colwise or colwise_gather) or leave both whole"
            )


def _unfit(module: nn.Module, style: str, degree: int) -> str:
    """Why the module's dimension the style splits does not divide over `degree` ranks, or ''."""
    if degree < 2 or not isinstance(module, SPLITTABLE) or not splits(style):
        return ""
    rows, cols = module.weight.shape  # Linear: (out, in); Embedding: (vocabulary, width)
    chunks = fused_chunks(style)
    if chunks is not None:
        if rows % chunks:
            return f"{rows} outputs are not {chunks} equal matrices"
        n, what = rows // chunks, f"each of its {chunks} matrices' {rows // chunks} outputs"
    elif isinstance(module, nn.Embedding):
        n, what = (cols, f"{cols} embedding features") if style == "colwise" else (rows, f"{rows} rows")
    else:
        n, what = (cols, f"{cols} input features") if style == "rowwise" else (rows, f"{rows} outputs")
    return f"{what} over {degree} ranks" if n % degree else ""


def _check_divide(model: nn.Module, divide: list[str], degree: int) -> None:
    """Every `divide` pattern names an attribute of some module, a whole number `degree` divides."""
    problems = []
    for pattern in divide:
        found = divided(model, [pattern])
        if not found:
            problems.append(f"{pattern} names no module's attribute")
        for owner, attr in found:
            value = getattr(owner, attr, None)
            if not hasattr(owner, attr):
                problems.append(f"{pattern}: {type(owner).__name__} has no attribute {attr}")
            elif isinstance(value, bool) or not isinstance(value, int):
                problems.append(f"{pattern}: {type(owner).__name__}.{attr} is {value!r}, not a whole number")
            elif degree > 1 and value % degree:
                problems.append(f"{pattern}: {value} does not divide over {degree} ranks")
    if problems:
        raise TensorParallelError(f"parallelism.tp.divide: {'; '.join(sorted(set(problems)))}")
