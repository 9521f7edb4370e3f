"""Models written the way users write them, without ranks: where the loss is taken from (a
tensor, GPT-2's (logits, loss), Hugging Face's output), the rules of the loss and tie settings,
tied parameters found, kept and refused, the fused q/k/v style and divided attributes checked on
the model, checkpoint blocks by wildcard, and the repeated blocks a memory refusal offers."""

from __future__ import annotations

import sys
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from torch import nn

from hpctrain.config import load_config
from hpctrain.engine.ties import TieError, check_units, retie, tied_groups
from hpctrain.orchestrate.validate import problems
from hpctrain.parallel.tensor.plan import fused_chunks, is_style
from hpctrain.parallel.tensor.split import TensorParallelError, check_plan
from hpctrain.train.modules import SplitError, resolve_blocks
from hpctrain.train.objective import LossOutputError, ModelLoss, logits_of, loss_of

PROJECT = Path(__file__).parents[1] / "user_project"


@pytest.fixture(scope="module", autouse=True)
def _forget_the_project() -> Iterator[None]:
    """The user project's package leaves this process with the module: the in-process CLI tests
    import their own copy of it by the same name."""
    yield
    for name in [n for n in sys.modules if n == "mypkg" or n.startswith("mypkg.")]:
        del sys.modules[name]


@pytest.fixture(scope="module")
def gpt() -> type[nn.Module]:
    sys.path.insert(0, str(PROJECT))
    try:
        from mypkg.gpt import GPT

        return GPT
    finally:
        sys.path.remove(str(PROJECT))


@dataclass
class Out:
    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None


LOSS, LOGITS = torch.tensor(0.5), torch.ones(2, 3)


@pytest.mark.parametrize(
    "out",
    [LOSS, (LOGITS, LOSS), (LOSS, LOGITS), [LOGITS, LOSS, None], {"loss": LOSS, "logits": LOGITS},
     OrderedDict(loss=LOSS), Out(loss=LOSS, logits=LOGITS), LOSS.reshape(1)],
    ids=["tensor", "gpt2-tuple", "hf-tuple", "list", "dict", "ordered-dict", "dataclass", "one-element"],
)  # fmt: skip
def test_the_loss_is_taken_from_what_users_models_return(out: object) -> None:
    assert loss_of(out).item() == 0.5 and loss_of(out).dim() == 0


@pytest.mark.parametrize(
    ("out", "said"),
    [
        ((LOGITS, None), "a tuple of 2 (a tensor (2, 3) float32, None)"),  # called without targets
        ((LOSS, LOSS), "a tuple of 2"),  # which one?
        ({"logits": LOGITS}, "a dict with keys ['logits']"),
        (Out(logits=LOGITS), "a Out"),
        (torch.tensor([1, 2]), "a tensor (2,) int64"),
    ],
)
def test_an_output_without_one_loss_is_refused_saying_what_it_was(out: object, said: str) -> None:
    with pytest.raises(LossOutputError, match="holds no loss") as e:
        loss_of(out)
    assert said in str(e.value), str(e.value)


def test_logits_are_read_for_held_out_accuracy() -> None:
    assert logits_of((LOGITS, None)) is LOGITS and logits_of(Out(logits=LOGITS)) is LOGITS
    assert logits_of({"logits": LOGITS}) is LOGITS and logits_of(LOGITS) is LOGITS
    assert logits_of((LOSS,)) is None and logits_of("text") is None


def test_model_loss_calls_forward_with_the_targets_as_the_model_takes_them(gpt: type[nn.Module]) -> None:
    m = gpt(vocab_size=16, block_size=8)
    x, y = torch.randint(0, 16, (2, 8)), torch.randint(0, 16, (2, 8))
    assert ModelLoss(None).targets_name(m) == "targets"
    assert ModelLoss(None)(m, x, y).item() == pytest.approx(m(x, y)[1].item())
    assert ModelLoss("labels").inputs(x, y) == ((x,), {"labels": y})
    with pytest.raises(LossOutputError, match="forward takes \\(input\\)"):
        ModelLoss(None).targets_name(nn.Linear(2, 2))


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["loss=model"], "loss.name"),  # the built-in cnn computes no loss
        (["model._target_=torch.nn.Identity", "loss=model", "loss._target_=torch.nn.MSELoss"], "loss._target_"),
        (["loss.targets_as=labels"], "loss.targets_as"),  # only loss=model passes targets to forward
        (["model._target_=torch.nn.Identity", "loss=model", "loss.targets_as='a b'"], "loss.targets_as"),
        (["model=cnn", "model.tie_embeddings=true"], "model.tie_embeddings"),
        (["model._target_=torch.nn.Identity", "model.tie_embeddings=true"], "model.tie_embeddings"),
    ],
    ids=["built-in-model", "loss-function-too", "targets-without-model-loss", "not-a-keyword", "cnn-tie", "user-tie"],
)  # fmt: skip
def test_loss_and_tie_settings_that_would_do_nothing_are_refused_by_key(
    overrides: list[str], key: str
) -> None:
    assert key in [p.key for p in problems(load_config(overrides))]


def test_tied_parameters_are_found_and_a_split_is_tied_again_or_refused(gpt: type[nn.Module]) -> None:
    m = gpt(vocab_size=16, block_size=8)
    assert tied_groups(m) == [("transformer.wte.weight", "lm_head.weight")]
    # a wrapper replaced each module's parameter (as parallelize_module does): one again
    m.lm_head.weight = nn.Parameter(m.lm_head.weight.detach().clone())
    retie(m, [("transformer.wte.weight", "lm_head.weight")], "the test")
    assert m.lm_head.weight is m.transformer.wte.weight
    m.lm_head.weight = nn.Parameter(torch.zeros(16, 4))  # a copy that cannot be the same tensor
    with pytest.raises(TieError, match="splits the tied parameters transformer.wte.weight, lm_head.weight"):
        retie(m, [("transformer.wte.weight", "lm_head.weight")], "the test")


def test_fsdp_units_may_not_cut_a_tie_apart(gpt: type[nn.Module]) -> None:
    m = gpt(vocab_size=16, block_size=8)
    check_units(m, ["Block"])  # the blocks: the tie stays in the root
    with pytest.raises(TieError, match=r"lm_head.weight \(unit lm_head\)"):
        check_units(m, ["lm_head"])


PLAN = {
    "transformer.wte": "rowwise",
    "transformer.h.*.attn.c_attn": "colwise_fused:3",
    "transformer.h.*.attn.c_proj": "rowwise",
    "lm_head": "colwise_gather",
}


def test_the_fused_style_and_divided_attributes_are_checked_on_the_model(gpt: type[nn.Module]) -> None:
    assert fused_chunks("colwise_fused:3") == 3 and is_style("colwise_fused:2")
    assert not any(is_style(s) for s in ("colwise_fused", "colwise_fused:1", "colwise_fused:x", "fused"))
    m = gpt(vocab_size=16, block_size=8, n_embd=32, n_head=4)
    divide = ["transformer.h.*.attn.n_head", "transformer.h.*.attn.n_embd"]
    assert check_plan(m, PLAN, 2, divide)["transformer.h.1.attn.c_attn"] == "colwise_fused:3"
    with pytest.raises(TensorParallelError, match=r"4 does not divide over 3 ranks"):
        check_plan(m, {}, 3, divide)
    with pytest.raises(TensorParallelError, match="outputs are not 5 equal matrices"):
        check_plan(m, {"transformer.h.0.attn.c_attn": "colwise_fused:5"}, 2)
    with pytest.raises(TensorParallelError, match="16 rows over 3 ranks"):  # the vocabulary
        check_plan(m, {"transformer.wte": "rowwise", "lm_head": "colwise_gather"}, 3)
    with pytest.raises(TensorParallelError, match="tied parameters transformer.wte.weight, lm_head.weight"):
        check_plan(m, {"transformer.wte": "colwise", "lm_head": "colwise_gather"}, 2)


def test_checkpoint_blocks_take_wildcards_and_keep_the_outermost(gpt: type[nn.Module]) -> None:
    m = gpt(vocab_size=16, block_size=8, n_layer=3)
    assert resolve_blocks(m, ["transformer.h.*"]) == list(m.transformer.h)  # not their attention too
    with pytest.raises(SplitError, match=r"\['blocks.\*'\] name no module .* transformer.h.0"):
        resolve_blocks(m, ["blocks.*"])


def test_a_memory_refusal_offers_to_recompute_a_user_models_repeated_blocks() -> None:
    from hpctrain.memory.predict import repeated_blocks

    cfg = load_config(["model._target_=mypkg.gpt.GPT", f"code.dir={PROJECT}"])
    assert repeated_blocks(cfg) == ["transformer.h.*"]
    assert repeated_blocks(load_config(["model=transformer", "data=tokens"])) == []  # it declares its own
