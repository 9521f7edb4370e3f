"""A model built on the meta device and drawn again module by module has exactly the weights one
rank draws building it whole, for every built-in model, and leaves the CPU generator where the
whole build would have (so whatever is drawn next, a user's dataset, is the same)."""

from __future__ import annotations

import pytest
import torch

from hpctrain.config import load_config
from hpctrain.train.materialize import defer, materialize, replayable
from hpctrain.train.parts import make_model

MODELS = {
    "cnn": ["model=cnn"],
    "mlp": ["model=mlp", "model.depth=3"],
    "resnet18": ["model=resnet18", "model.width=8"],
    "transformer": ["model=transformer", "data=tokens", "model.width=32"],
}


@pytest.mark.parametrize("name", list(MODELS))
def test_weights_drawn_again_equal_those_of_the_whole_build(name: str) -> None:
    cfg = load_config(MODELS[name])
    torch.manual_seed(7)
    eager = make_model(cfg)
    eager_after = torch.get_rng_state()
    torch.manual_seed(7)
    state = torch.get_rng_state()
    with torch.device("meta"):
        lazy = make_model(cfg)
    assert replayable(lazy)
    deferred = defer(lazy, state)
    assert torch.equal(torch.get_rng_state(), eager_after)
    materialize(lazy, deferred, torch.device("cpu"))
    assert torch.equal(torch.get_rng_state(), eager_after)
    want, got = eager.state_dict(), lazy.state_dict()
    assert want.keys() == got.keys()
    for k in want:
        assert torch.equal(want[k], got[k]), k


def test_a_module_that_draws_outside_reset_parameters_is_built_whole() -> None:
    class Drawn(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(3))

    assert not replayable(Drawn())
    assert replayable(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU()))
