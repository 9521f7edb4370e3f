"""The rules of what training minimises and how: the optimizer (optim.*) and the loss (loss.*).
Each problem names the key, the rule and the fix."""

from __future__ import annotations

from hpctrain.config.options import OPTIM_READS
from hpctrain.config.schema import Config, OptimConf
from hpctrain.errors import Problem


def objective_problems(cfg: Config) -> list[Problem]:
    return _optim_problems(cfg) + _loss_problems(cfg)


def _optim_problems(cfg: Config) -> list[Problem]:
    o = cfg.optim
    p = []
    if o.lr <= 0:  # NaN and inf: value_problems
        p.append(Problem("optim.lr", f"must be > 0 (got {o.lr:g})", "set optim.lr to a positive number"))
    if o.momentum < 0 or o.momentum >= 1:
        p.append(
            Problem(
                "optim.momentum",
                f"must be in [0, 1) (got {o.momentum:g})",
                "set optim.momentum=0.9 (or 0 for plain SGD)",
            )
        )
    if len(o.betas) != 2 or not all(0 <= b < 1 for b in o.betas):
        p.append(
            Problem(
                "optim.betas",
                f"must be two numbers in [0, 1) (got {list(o.betas)})",
                "set optim.betas=[0.9,0.999]",
            )
        )
    if not o.eps > 0:
        p.append(Problem("optim.eps", f"must be > 0 (got {o.eps:g})", "e.g. optim.eps=1e-8"))
    if not 0 <= o.alpha < 1:
        p.append(Problem("optim.alpha", f"must be in [0, 1) (got {o.alpha:g})", "e.g. optim.alpha=0.99"))
    if o.nesterov and o.momentum <= 0:
        p.append(
            Problem(
                "optim.nesterov", "needs momentum (optim.momentum=0)", "set optim.momentum=0.9, or drop it"
            )
        )
    return p + _optim_unread(o)


def _optim_unread(o: OptimConf) -> list[Problem]:
    """A key the chosen optimizer does not read, set anyway, would silently do nothing; the
    learning rate of a user's optimizer is optim.lr (scaled and warmed up), never a keyword."""
    if o._target_ is not None:
        return (
            [
                Problem(
                    "optim.kwargs.lr",
                    "the learning rate is optim.lr (scaled and warmed up by hpctrain)",
                    "set optim.lr instead",
                )
            ]
            if "lr" in o.kwargs
            else []
        )
    default, reads = OptimConf(), OPTIM_READS[str(o.name)]
    return [
        Problem(
            f"optim.{key}",
            f"is not read by optim.name={o.name} (it reads {', '.join(reads)})",
            f"drop optim.{key}, or choose an optimizer that takes it",
        )
        for key in ("momentum", "nesterov", "betas", "eps", "alpha", "weight_decay")
        if key not in reads and getattr(o, key) != getattr(default, key)
    ]


def _loss_problems(cfg: Config) -> list[Problem]:
    """loss=model calls the model with the targets: a built-in model takes none, and a loss
    function beside it would never be called; loss.targets_as names that call's keyword."""
    lo, p = cfg.loss, []
    if lo.name == "model":
        if not cfg.model._target_ and not cfg.script.path:
            p.append(
                Problem(
                    "loss.name",
                    f"loss=model: the model computes its own loss, which the built-in model {cfg.model.name} does not",
                    "drop loss=model (the built-in models train with cross_entropy), or set model._target_ to your model",
                )
            )
        if lo._target_:
            p.append(
                Problem(
                    "loss._target_",
                    "loss=model takes the loss the model returns: a loss function would never be called",
                    "drop loss._target_, or use loss=cross_entropy with it",
                )
            )
    elif lo.targets_as is not None:
        p.append(
            Problem(
                "loss.targets_as",
                "names the keyword the model takes the targets as, which only loss=model passes",
                "set loss=model, or drop loss.targets_as",
            )
        )
    if lo.targets_as is not None and not lo.targets_as.isidentifier():
        p.append(
            Problem(
                "loss.targets_as",
                f"{lo.targets_as!r} is not a keyword a forward can take",
                "give the name of your forward's targets argument, e.g. loss.targets_as=labels",
            )
        )
    return p
