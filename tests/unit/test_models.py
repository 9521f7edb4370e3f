"""Every model maps its input to logits of the right shape, and trains a step."""

from __future__ import annotations

import pytest
import torch

from hpctrain.config import load_config
from hpctrain.train.models import InputSpec, build_model


@pytest.mark.parametrize(
    "overrides,x_shape,logits_shape",
    [
        (["model=cnn"], (4, 3, 32, 32), (4, 10)),
        (["model=cnn", "data=digits"], (4, 1, 8, 8), (4, 10)),
        (["model=mlp"], (4, 3, 32, 32), (4, 10)),
        (["model=resnet18", "model.width=8"], (2, 3, 32, 32), (2, 10)),
        (["model=resnet50", "model.width=8", "data.image_size=64"], (2, 3, 64, 64), (2, 10)),
        (["model=transformer", "data=tokens", "model.width=32"], (2, 64), (2, 64, 256)),
    ],
)
def test_model_output_shape(
    overrides: list[str], x_shape: tuple[int, ...], logits_shape: tuple[int, ...]
) -> None:
    cfg = load_config(overrides)
    model = build_model(cfg.model, InputSpec.from_data(cfg.data))
    x = torch.randint(0, 256, x_shape) if cfg.data.name == "tokens" else torch.randn(x_shape)
    out = model(x)
    assert tuple(out.shape) == logits_shape
    out.float().mean().backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_resnet_depths_match_the_paper() -> None:
    cfg = load_config(["model=resnet18"])
    spec = InputSpec.from_data(cfg.data)
    convs18 = sum(
        isinstance(m, torch.nn.Conv2d) and m.kernel_size == (3, 3)
        for m in build_model(cfg.model, spec).modules()
    )
    assert convs18 == 17  # stem + 16 in basic blocks; with the head: 18 weighted layers
    r50 = build_model(load_config(["model=resnet50"]).model, spec)
    params = sum(p.numel() for p in r50.parameters())
    assert 23_000_000 < params < 24_000_000  # ResNet-50 minus the 1000-class head: ~23.5 M


@pytest.mark.parametrize("channels_last", [True, False])
def test_channels_last_changes_the_memory_format_of_weights_and_batches(channels_last: bool) -> None:
    from hpctrain.train.loop import place_batch
    from hpctrain.train.setup import place_model

    cfg = load_config(["model=resnet18", "model.width=8", f"model.channels_last={channels_last}"])
    cpu = torch.device("cpu")
    model = place_model(cfg, build_model(cfg.model, InputSpec.from_data(cfg.data)), cpu)
    # (a 1x1 kernel is contiguous in both formats: only the larger kernels tell them apart)
    convs = [m.weight for m in model.modules() if isinstance(m, torch.nn.Conv2d) and m.kernel_size != (1, 1)]
    nhwc = torch.channels_last
    assert convs and all(w.is_contiguous(memory_format=nhwc) == channels_last for w in convs)
    x = place_batch(cfg, torch.randn(2, 3, 32, 32), cpu)
    assert x.is_contiguous(memory_format=nhwc) == channels_last
    assert x.is_contiguous() != channels_last  # NCHW-contiguous exactly when not NHWC


@pytest.mark.parametrize(
    "precision,dtype", [("fp16", torch.float16), ("bf16", torch.bfloat16), ("fp32", torch.float32)]
)
def test_autocast_computes_activations_in_the_chosen_precision(precision: str, dtype: torch.dtype) -> None:
    """The context train_step runs the forward pass in: the conv and linear layers really produce
    fp16 / bf16 activations (fp32 for fp32), while the weights stay fp32."""
    from hpctrain.train.precision import autocast

    cfg = load_config(["model=cnn", f"precision={precision}"])
    model = build_model(cfg.model, InputSpec.from_data(cfg.data))
    seen: dict[str, torch.dtype] = {}
    for name, m in model.named_modules():
        if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear)):
            m.register_forward_hook(lambda mod, inp, out, name=name: seen.__setitem__(name, out.dtype))
    with autocast(cfg.precision.name, "cpu"):
        model(torch.randn(4, 3, 32, 32))
    assert seen and set(seen.values()) == {dtype}, seen
    assert all(p.dtype == torch.float32 for p in model.parameters())
