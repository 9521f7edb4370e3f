"""train.compile on the rank: which modules are compiled, and where inductor keeps its kernels
(the compiled runs themselves: tests/mpi/test_compile.py)."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from torch import nn

from hpctrain.config import load_config
from hpctrain.config.schema import Config
from hpctrain.train.compile import CACHE, compile_blocks, compile_seconds


def _model(*overrides: str) -> tuple[nn.Module, Config]:
    from hpctrain.parallel import derive
    from hpctrain.train.setup import build_model

    cfg = load_config([*overrides, "cluster.ranks=1", "train.compile=true"])
    return build_model(cfg, derive(cfg), torch.device("cpu"))[0], cfg


def _compiled(model: nn.Module) -> list[str]:
    return sorted(n or "<root>" for n, m in model.named_modules() if getattr(m, "_compiled_call_impl", None))


def test_the_declared_blocks_are_compiled_each_and_the_rest_stays_eager(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    model, cfg = _model("model=transformer", "model.depth=3", "data=tokens")
    notes: list[str] = []
    compile_blocks(cfg, model, tmp_path, notes)
    assert _compiled(model) == ["blocks.layers.0", "blocks.layers.1", "blocks.layers.2"]  # not the root
    assert "blocks.layers.0, blocks.layers.1, blocks.layers.2 compiled" in notes[0]
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / CACHE)  # the run's: a requeue reuses it


def test_a_model_without_blocks_is_compiled_whole_and_nothing_without_the_switch(tmp_path: Path) -> None:
    _, cfg = _model("model=cnn")
    own = replace(cfg, model=replace(cfg.model, _target_="mine.Net", checkpoint_blocks=[]))  # declares none
    notes: list[str] = []
    whole = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    compile_blocks(own, whole, tmp_path, notes)
    assert _compiled(whole) == ["<root>"] and "the whole model" in notes[0]
    off = replace(cfg, train=replace(cfg.train, compile=False))
    eager, _ = _model("model=cnn")
    compile_blocks(off, eager, tmp_path, notes)
    assert _compiled(eager) == [] and len(notes) == 1


def test_compile_seconds_are_never_negative_and_zero_before_dynamo_is_imported() -> None:
    import subprocess
    import sys

    code = "from hpctrain.train.compile import compile_seconds; print(compile_seconds())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert float(out.stdout) == 0.0 and compile_seconds() >= 0.0
