"""Sharded checkpoints (parallelism=fsdp | hsdp), written with torch.distributed.checkpoint:

    checkpoints/step-000120.dcp/   every rank's shard (__R_0.distcp) and the metadata (.metadata)

Every rank writes its part into a hidden directory; once all have, rank 0 renames it into place
and points `latest` at it (checkpoint.py's protocol), so a killed save never leaves `latest`
naming a partial checkpoint. DCP records which slice of every tensor each file holds, so a
checkpoint written by N ranks loads on any number of ranks (resharded as it is read), and into an
unsharded model too: checkpoints move between fsdp and data parallelism in both directions.

In memory, both formats meet as a "portable" state: the model's full state dict and the optimizer
state keyed by parameter name (what torch.distributed.checkpoint.state_dict produces).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hpctrain import records
from hpctrain.train.checkpoint import DIR, SUFFIX, CheckpointError, by_name, param_names, prune, read_state


def save(
    run_dir: Path, step: int, model: nn.Module, optimizer: Any, master: bool, barrier: Callable[[str], None]
) -> Path:
    """Collective: every rank writes its shards; rank 0 publishes the checkpoint."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    d = run_dir / DIR
    tmp, final = d / f".step-{step:06d}{SUFFIX}", d / f"step-{step:06d}{SUFFIX}"
    if master:
        d.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)  # a killed save's part
    barrier(f"hpctrain.dcp.{step}.begin")
    msd, osd = get_state_dict(model, optimizer)
    dcp.save(
        {"model": msd, "optimizer": osd, "step": step, "torch_rng": torch.get_rng_state()}, checkpoint_id=tmp
    )
    barrier(f"hpctrain.dcp.{step}.written")
    if master:
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        records.write_atomic(run_dir / records.LATEST_CHECKPOINT, final.name + "\n")
        prune(d)
    return final


def load_sharded(path: Path, model: nn.Module, optimizer: Any) -> int:
    """Into a sharded model and its optimizer, from either format (collective for DCP)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

    try:
        if path.is_dir():
            import torch.distributed.checkpoint as dcp

            msd, osd = get_state_dict(model, optimizer)
            state: dict[str, Any] = {
                "model": msd,
                "optimizer": osd,
                "step": 0,
                "torch_rng": torch.get_rng_state(),
            }
            dcp.load(state, checkpoint_id=path)
            set_state_dict(
                model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"]
            )
        else:  # a data-parallel checkpoint: whole tensors, optimizer state by parameter index
            state = _read(path)
            full = StateDictOptions(full_state_dict=True)
            osd = by_name(state["optimizer"], param_names(model))
            set_state_dict(
                model, optimizer, model_state_dict=state["model"], optim_state_dict=osd, options=full
            )
        torch.set_rng_state(state["torch_rng"])
    except (RuntimeError, KeyError, ValueError) as e:
        raise CheckpointError(f"{path} does not fit this run's model or optimizer: {e}") from e
    return int(state["step"])


def _read(path: Path) -> dict[str, Any]:
    try:
        state = read_state(path)  # never unpickles code (train/checkpoint.py)
    except CheckpointError:
        raise
    except Exception as e:  # noqa: BLE001 - truncated, corrupt or foreign
        raise CheckpointError(f"{type(e).__name__}: {e}") from e
    if not isinstance(state, dict):
        raise CheckpointError("not an hpctrain checkpoint")
    return state
