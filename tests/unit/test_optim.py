"""The built-in trainer's optimizers: torch's updates bit for bit, torch's state dicts, and no
import of torch._dynamo (what they exist for, as `hpctrain bench startup` shows)."""

from __future__ import annotations

import argparse

import pytest
import torch
from rich.console import Console
from torch import nn

from hpctrain.bench.startup import run_startup
from hpctrain.train import optim

KINDS = [
    (optim.SGD, torch.optim.SGD, {"lr": 0.1, "momentum": 0.9, "weight_decay": 1e-3}),
    (optim.SGD, torch.optim.SGD, {"lr": 0.1, "momentum": 0.9, "nesterov": True}),
    (optim.AdamW, torch.optim.AdamW, {"lr": 1e-2, "betas": (0.8, 0.99), "weight_decay": 0.1}),
    (optim.Adam, torch.optim.Adam, {"lr": 1e-2, "eps": 1e-4, "weight_decay": 0.1}),
    (optim.Adagrad, torch.optim.Adagrad, {"lr": 1e-2, "eps": 1e-10, "weight_decay": 0.1}),
    (optim.RMSprop, torch.optim.RMSprop, {"lr": 1e-2, "alpha": 0.9, "momentum": 0.5, "weight_decay": 0.1}),
]


def _train(
    opt_cls: type[torch.optim.Optimizer], kwargs: dict, steps: int = 5
) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
    opt = opt_cls(model.parameters(), **kwargs)
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        opt.zero_grad()
        x, y = torch.randn(16, 6, generator=g), torch.randint(0, 3, (16,), generator=g)
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return model, opt


@pytest.mark.parametrize(("ours", "theirs", "kwargs"), KINDS)
def test_the_same_updates_and_state_as_torch(ours: type, theirs: type, kwargs: dict) -> None:
    m1, o1 = _train(ours, kwargs)
    m2, o2 = _train(theirs, kwargs)
    assert isinstance(o1, theirs) and o1.step.__doc__ == theirs.step.__doc__
    for a, b in zip(m1.parameters(), m2.parameters()):
        assert torch.equal(a, b)
    s1, s2 = o1.state_dict(), o2.state_dict()
    assert s1["param_groups"] == s2["param_groups"]
    for k in s2["state"]:
        assert s1["state"][k].keys() == s2["state"][k].keys()
        assert all(torch.equal(s1["state"][k][n], s2["state"][k][n]) for n in s2["state"][k])
    # a checkpoint written by either loads into the other
    o2.load_state_dict(s1)
    o1.load_state_dict(s2)


def test_a_closure_is_evaluated_with_gradients_and_the_update_without() -> None:
    model = nn.Linear(2, 1)
    opt = optim.SGD(model.parameters(), lr=0.1)
    seen = []

    def closure() -> torch.Tensor:
        opt.zero_grad()
        seen.append(torch.is_grad_enabled())
        loss = model(torch.ones(1, 2)).sum()
        loss.backward()
        return loss

    assert opt.step(closure) is not None and seen == [True]
    assert torch.is_grad_enabled()


def test_the_startup_bench_shows_torch_importing_dynamo_and_hpctrain_not() -> None:
    """2.3 s of CPU per rank at start: a torch release that brings the import back fails here.
    torch's own SGD, run alongside, shows that the check can see the import."""
    console = Console(record=True, width=200)
    assert run_startup(argparse.Namespace(repeats=1), console) == 0
    rows = {
        line.split("│")[1].strip(): line.split("│")[-2].strip()
        for line in console.export_text().splitlines()
        if "SGD" in line
    }
    assert rows == {
        "torch.optim.SGD": "True",
        "torch.optim.SGD, collector held": "True",
        "hpctrain optim.SGD": "False",
        "hpctrain optim.SGD, collector held": "False",
    }, console.export_text()


@pytest.mark.parametrize(
    ("overrides", "theirs", "expect"),
    [
        (["optim=sgd", "optim.nesterov=true"], torch.optim.SGD, {"momentum": 0.9, "nesterov": True, "weight_decay": 0.0}),
        (["optim=adam", "optim.eps=1e-4"], torch.optim.Adam, {"betas": (0.9, 0.999), "eps": 1e-4, "weight_decay": 0.0}),
        (["optim=adamw"], torch.optim.AdamW, {"betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01}),
        (["optim=adagrad"], torch.optim.Adagrad, {"eps": 1e-10, "weight_decay": 0.0}),
        (["optim=rmsprop", "optim.momentum=0.5"], torch.optim.RMSprop, {"alpha": 0.99, "momentum": 0.5, "eps": 1e-8}),
        (["optim._target_=torch.optim.NAdam", "+optim.kwargs.momentum_decay=0.002"], torch.optim.NAdam, {"momentum_decay": 0.002}),
    ],
    ids=["sgd-nesterov", "adam", "adamw", "adagrad", "rmsprop", "user-nadam"],
)  # fmt: skip
def test_each_optimizer_is_torchs_class_with_the_keys_it_reads(
    overrides: list[str], theirs: type, expect: dict
) -> None:
    """optim.name picks torch.optim's class of that name with the optim.* keys it reads (its
    lr the run's, after scaling); optim._target_ is the user's class, given lr and its kwargs."""
    from hpctrain.config import load_config

    cfg = load_config(overrides)
    built = optim.build(cfg.optim, nn.Linear(2, 2).parameters(), lr=0.25)
    assert isinstance(built, theirs)
    group = built.param_groups[0]
    assert group["lr"] == 0.25 and {k: group[k] for k in expect} == expect, group


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["optim=adamw", "optim.momentum=0.5"], "optim.momentum"),  # AdamW reads no momentum
        (["optim=sgd", "optim.betas=[0.8,0.9]"], "optim.betas"),
        (["optim=sgd", "optim.momentum=0", "optim.nesterov=true"], "optim.nesterov"),
        (["optim=adam", "optim.eps=0"], "optim.eps"),
        (["optim._target_=torch.optim.NAdam", "+optim.kwargs.lr=0.1"], "optim.kwargs.lr"),
        (["optim._target_=torch.optim.NAdam", "optim.momentum=0.5"], "optim.momentum"),  # not its keyword
        (["optim._target_=torch.optim.NAdam", "+optim.kwargs.nonsense=1"], "optim.kwargs"),
    ],
)
def test_an_optimizer_setting_that_would_do_nothing_or_break_is_refused_by_key(
    overrides: list[str], key: str
) -> None:
    from hpctrain.config import load_config
    from hpctrain.orchestrate.validate import problems

    assert key in [p.key for p in problems(load_config(overrides))]
