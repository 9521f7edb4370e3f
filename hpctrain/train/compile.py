"""train.compile: torch.compile of each of the model's repeated blocks, as TorchTitan compiles each
transformer block: one graph that every block of the same shape reuses, so compile time does not
grow with depth, and a graph break stays inside one block. A model with no declared blocks is
compiled whole. Module.compile compiles in place (the module stays itself), so it runs where the
trainer builds the model: after the model is split (tensor parallelism) and its blocks are wrapped
for recomputation, before DDP or FSDP2 wrap or shard it (TorchTitan's order).

Inductor's cache lives in the run directory (cache/inductor), so a requeued or restarted run finds
its kernels there. The compile happens in the first (warm-up) step; its seconds are read from
dynamo's own accounting (`compile_seconds`) and recorded apart from the steps'."""

from __future__ import annotations

import os
from pathlib import Path

from torch import nn

from hpctrain.config.schema import Config
from hpctrain.config.split import declared_checkpoint_blocks
from hpctrain.train.modules import resolve_blocks

CACHE = Path("cache") / "inductor"  # under the run directory
# dynamo's cumulative timers (torch._dynamo.utils.cumulative_time_spent_ns) that span a whole compile
COMPILE_TIMERS = ("entire_frame_compile", "entire_backward_compile")


def compile_blocks(cfg: Config, module: nn.Module, run_dir: Path, notes: list[str]) -> None:
    """Each declared block of `module` compiled in place (the whole module where it declares
    none), said in `notes` (what rank 0 tells the user). Nothing where train.compile is off."""
    if not cfg.train.compile:
        return
    # read at compile time; set whatever an import set it to (torch's own default: a /tmp folder)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(run_dir / CACHE)
    os.environ["TRITON_CACHE_DIR"] = str(run_dir / CACHE / "triton")
    mode = None if cfg.train.compile_mode == "default" else str(cfg.train.compile_mode)
    names = declared_checkpoint_blocks(cfg.model)
    blocks = resolve_blocks(module, names) if names else []
    for block in blocks or [module]:
        block.compile(mode=mode)
    by_id = {id(m): n for n, m in module.named_modules()}
    what = (
        ", ".join(by_id.get(id(b), "") for b in blocks) if blocks else "the whole model (no blocks declared)"
    )
    notes.append(
        f"train.compile: {what} compiled ({mode or 'default'} mode), in the first step; cache {run_dir / CACHE}"
    )


def compile_seconds() -> float:
    """Seconds this process spent compiling (dynamo, AOT autograd, inductor), forward and backward
    graphs; 0 where nothing was compiled (dynamo never imported)."""
    import sys

    utils = sys.modules.get("torch._dynamo.utils")
    if utils is None:
        return 0.0
    spent = getattr(utils, "cumulative_time_spent_ns", {})
    return sum(float(spent.get(k, 0.0)) for k in COMPILE_TIMERS) / 1e9
