"""Mixed precision: autocast per precision, and a gradient scaler for fp16 only.

bf16 keeps fp32's exponent range, so it needs no loss scaling; fp16 overflows/underflows
without it (Micikevicius et al. 2018, "Mixed Precision Training", arXiv:1710.03740).
"""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager as ContextManager

import torch

from hpctrain.config.schema import PrecisionConf

DTYPES = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}


def autocast(precision: str, device_type: str) -> ContextManager[object]:
    dtype = DTYPES[precision]
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device_type, dtype=dtype)


def make_scaler(cfg: PrecisionConf, device_type: str) -> torch.amp.GradScaler | None:
    if cfg.name != "fp16":
        return None
    return torch.amp.GradScaler(device_type, init_scale=cfg.init_scale, growth_interval=cfg.growth_interval)
