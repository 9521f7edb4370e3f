"""Named parts of a model, the user's or the built-in one: activation checkpointing of named blocks
(wildcards over repeated ones), and consecutive modules of its chain held as one piece under their
whole-model names (what a pipeline over a mesh cuts a model into, and what the memory trace
follows)."""

from __future__ import annotations

import torch
from torch import nn

from hpctrain.errors import HpctrainError


class SplitError(HpctrainError):
    """The model cannot be cut or checkpointed where the config says."""


def checkpoint_blocks(module: nn.Module, names: list[str]) -> None:
    """Activation checkpointing of the named blocks (torch's checkpoint_wrapper, non-reentrant):
    each keeps only its input and recomputes the rest in the backward pass. State dicts keep
    their keys (the wrapper strips its own prefix). Names may hold wildcards (resolve_blocks)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        apply_activation_checkpointing,
    )

    blocks = {id(m) for m in resolve_blocks(module, names)}
    apply_activation_checkpointing(module, check_fn=lambda m: id(m) in blocks)


def resolve_blocks(module: nn.Module, names: list[str]) -> list[nn.Module]:
    """The modules the names match (fnmatch: `*` spans dots, transformer.h.* every block), the
    outermost only: a block inside a matched block is recomputed with it. SplitError for a name
    that matches nothing, listing the model's upper modules."""
    import fnmatch

    known = [(n, m) for n, m in module.named_modules() if n]
    unknown = [p for p in names if not any(fnmatch.fnmatchcase(n, p) for n, _ in known)]
    if unknown:
        upper = [n for n, _ in known if n.count(".") < 3]
        raise SplitError(
            f"model.checkpoint_blocks: {unknown} name no module of the model; its modules include "
            f"{', '.join(upper[:24])}{' ...' if len(upper) > 24 else ''}"
        )
    hits = sorted({n for n, _ in known for p in names if fnmatch.fnmatchcase(n, p)})
    outer = [n for n in hits if not any(n.startswith(h + ".") for h in hits)]
    by_name = dict(known)
    return [by_name[n] for n in outer]


class ChainPiece(nn.Module):
    """Consecutive modules of a chain, registered under their names in the whole model (so state
    dicts, tensor-parallel plans and FSDP units name them as they name the whole model's), run one
    after the other."""

    def __init__(self, whole: nn.Module, names: list[str]) -> None:
        super().__init__()
        self.order = list(names)
        for name in names:
            attach(self, name, whole.get_submodule(name))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for name in self.order:  # looked up each time: checkpointing wraps modules in place
            x = self.get_submodule(name)(x)
        return x


def attach(root: nn.Module, name: str, module: nn.Module) -> None:
    """`module` at the dotted `name` under `root`, with bare containers on the way."""
    *path, leaf = name.split(".")
    at = root
    for part in path:
        if part not in at._modules:
            at.add_module(part, nn.Module())
        at = at.get_submodule(part)
    at.add_module(leaf, module)
