"""What fake tensors cannot follow in a user's model, and where it happened. A forward that reads
a value (`if y.sum() > 0`, `.item()`, `nonzero()`), hands a tensor to NumPy or needs its storage
cannot run on FakeTensorMode's tensors, which have shapes but no values; on the ranks it runs.
Such a failure leaves the memory unpredicted, never refuses the run; the message names the module
whose forward was running and the op, so that the user can see it is their code, not a bug."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from torch import nn
from torch.nn.modules import module as torch_module

# what torch says when an op needs values a fake tensor does not hold (the exception's module, or
# its text: `.numpy()` and storage access raise plain RuntimeErrors)
_FAKE_MODULES = ("torch._subclasses", "torch.fx", "torch._dynamo")
_FAKE_TEXT = ("tensor subclass", "faketensor", "fake tensor", "data-dependent", "data dependent", "data pointer", "meta tensor")  # fmt: skip


def cannot_follow(e: BaseException) -> bool:
    """Whether `e` (or what caused it) is fake tensors' limit rather than the model's error."""
    seen: BaseException | None = e
    while seen is not None:
        text = f"{type(seen).__name__}: {seen}".lower()
        if type(seen).__module__.startswith(_FAKE_MODULES) or any(t in text for t in _FAKE_TEXT):
            return True
        seen = seen.__cause__
    return False


@dataclass
class Where:
    """The modules whose forward runs, outermost first (names from named_modules)."""

    names: dict[int, str]
    stack: list[str] = field(default_factory=list)

    def innermost(self) -> str:
        return self.stack[-1] if self.stack else ""


@contextlib.contextmanager
def following(model: nn.Module) -> Iterator[Where]:
    """Track which of `model`'s modules runs (torch's global forward hooks); after a failure the
    stack still holds the one that raised, since its forward hook never ran."""
    root = type(model).__qualname__
    where = Where(
        {id(m): f"{name} ({type(m).__name__})" if name else root for name, m in model.named_modules()}
    )

    def enter(m: nn.Module, _args: Any) -> None:
        if id(m) in where.names:
            where.stack.append(where.names[id(m)])

    def leave(m: nn.Module, _args: Any, _out: Any) -> None:
        if id(m) in where.names and where.stack:
            where.stack.pop()

    handles = [
        torch_module.register_module_forward_pre_hook(enter),
        torch_module.register_module_forward_hook(leave),
    ]
    try:
        yield where
    finally:
        for h in handles:
            h.remove()


def unfollowed(e: BaseException, where: Where) -> str:
    """The line that says what could not be traced, where, and that the run is not refused."""
    cause = e.__cause__ or e
    text = str(cause).strip().splitlines()[0][:200] if str(cause).strip() else "(no message)"
    at = f" in the forward of {where.innermost()}" if where.innermost() else ""
    return (
        f"fake tensors cannot follow the model{at}: {type(cause).__name__}: {text} (it needs a tensor's "
        "values, which the trace does not have); the ranks run it, unchecked against the limit"
    )
