"""The built-in trainer's optimizers: torch's SGD, Adam, AdamW, Adagrad and RMSprop (optim.name),
the same updates, minus the wrappers that exist only for torch.compile; or the user's own class
(optim._target_), as it is.

torch.optim's step() and four housekeeping methods (add_param_group, zero_grad, state_dict,
load_state_dict) are wrapped to mark graph breaks and to disable TorchDynamo inside compiled
code; the wrappers import torch._dynamo on first use, which costs every rank about 2.3 s of CPU
at start (measured on this project's CPU build: `python -X importtime -c "import torch._dynamo"`).
The built-in trainer never compiles, so its optimizers call the undecorated methods; step()
keeps the one thing its wrapper does outside compilation, running under no_grad. A user's own
code (script=) keeps torch's optimizers untouched. If a torch release stops exposing the
undecorated methods (functools' __wrapped__), the plain torch classes are used.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar, cast

import torch

from hpctrain.config.options import OPTIM_READS
from hpctrain.config.schema import OptimConf

OptT = TypeVar("OptT", bound=torch.optim.Optimizer)
_HOUSEKEEPING = ("add_param_group", "zero_grad", "state_dict", "load_state_dict")


def _undecorated(cls: type, name: str) -> Callable[..., Any] | None:
    return getattr(getattr(cls, name, None), "__wrapped__", None)


def _without_compile_wrappers(base: type[OptT]) -> type[OptT]:
    """`base` with its step and housekeeping methods undecorated, or `base` itself."""
    found = {name: _undecorated(base, name) for name in (*_HOUSEKEEPING, "step")}
    methods = {name: m for name, m in found.items() if m is not None}
    if len(methods) < len(found):
        return base
    raw_step = methods.pop("step")

    def step(self: torch.optim.Optimizer, closure: Callable[[], Any] | None = None) -> Any:
        with torch.no_grad():  # what the wrapper does when defaults["differentiable"] is False
            return raw_step(self, closure)

    step.__doc__ = base.step.__doc__
    return cast(type[OptT], type(base.__name__, (base,), {**methods, "step": step, "__module__": __name__}))


SGD = _without_compile_wrappers(torch.optim.SGD)
Adam = _without_compile_wrappers(torch.optim.Adam)
AdamW = _without_compile_wrappers(torch.optim.AdamW)
Adagrad = _without_compile_wrappers(torch.optim.Adagrad)
RMSprop = _without_compile_wrappers(torch.optim.RMSprop)


BUILT_IN: dict[str, Callable[..., torch.optim.Optimizer]] = {
    "sgd": SGD,
    "adam": Adam,
    "adamw": AdamW,
    "adagrad": Adagrad,
    "rmsprop": RMSprop,
}


def build(o: OptimConf, params: Iterable[Any], lr: float) -> torch.optim.Optimizer:
    """optim.name's optimizer over `params` at `lr`, or optim._target_'s (train/targets.py)."""
    if o._target_ is not None:
        from hpctrain.train import targets

        made = targets.build_optimizer(o._target_, dict(o.kwargs), params, lr)
        if not isinstance(made, torch.optim.Optimizer):
            raise targets.WorkloadError(
                f"optim._target_={o._target_} returned a {type(made).__name__}, not a torch.optim.Optimizer"
            )
        return made
    name = str(o.name)
    keywords = {k: getattr(o, k) for k in OPTIM_READS[name]}
    if "betas" in keywords:
        keywords["betas"] = tuple(keywords["betas"])
    return BUILT_IN[name](params, lr=lr, **keywords)
