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
from hpctrain.train.checkpoint import (
    DIR,
    SUFFIX,
    CheckpointError,
    by_name,
    param_names,
    planted,
    prune,
    read_usable,
    save_failure,
)


def save(
    run_dir: Path, step: int, model: nn.Module, optimizer: Any, master: bool, barrier: Callable[[str], None]
) -> Path:
    """Collective: every rank writes its shards; rank 0 publishes the checkpoint."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    d = run_dir / DIR
    tmp, final = d / f".step-{step:06d}{SUFFIX}", d / f"step-{step:06d}{SUFFIX}"
    if master:
        d.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)  # a killed save's part
    barrier(f"hpctrain.dcp.{step}.begin")
    from torch.distributed.checkpoint.api import CheckpointException

    # the optimizer's state and hyperparameters keyed by parameter name, not by group index: a
    # pipeline's ranks each hold other parameters, and one name means one value on every rank
    msd, osd = get_state_dict(model, optimizer, options=StateDictOptions(flatten_optimizer_state_dict=True))
    msd, osd = storable(msd), with_aliases(storable(osd), model)
    try:
        dcp.save(
            {"model": msd, "optimizer": osd, "step": step, "torch_rng": torch.get_rng_state()},
            checkpoint_id=tmp,
        )
    except (Exception, CheckpointException) as e:  # torch's zip writer hides ENOSPC behind its own error
        raise save_failure(tmp, e) from e
    barrier(f"hpctrain.dcp.{step}.written")
    if master:
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        records.write_atomic(run_dir / records.LATEST_CHECKPOINT, final.name + "\n")
        prune(d)
    return final


def load_sharded(path: Path, model: nn.Module, optimizer: Any) -> int:
    """Into a sharded model and its optimizer, from either format. Collective: every rank reaches
    the same verdict (CheckpointError, saying why, on all of them, or the same step everywhere),
    so a restart moves on to an older checkpoint together."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

    if path.is_dir():
        md, unreadable = _metadata(path)  # read once: the optimizer's layout and the fit both ask it
        options = StateDictOptions(flatten_optimizer_state_dict=flat_optimizer(md))
        msd, osd = get_state_dict(model, optimizer, options=options)
        msd, osd = storable(msd), storable(osd)  # read whole, then set into the slices
        state: dict[str, Any] = {
            "model": msd,
            "optimizer": osd,
            "step": 0,
            "torch_rng": torch.get_rng_state(),
        }
        _agree(unreadable or _unfit(md, state))
        _agree(_dcp_load(path, state))
    else:  # a data-parallel checkpoint: whole tensors, optimizer state by parameter index
        state, why = read_usable(path, ("model", "optimizer", "step", "torch_rng"))
        _agree(why)
        state["optimizer"] = by_name(state["optimizer"], param_names(model))
        options = StateDictOptions(full_state_dict=True)
    try:
        set_state_dict(
            model,
            optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state["optimizer"],
            options=options,
        )
        torch.set_rng_state(state["torch_rng"])
        why = None
    except (RuntimeError, KeyError, ValueError) as e:
        why = f"does not fit this run's model or optimizer ({type(e).__name__}: {str(e)[:160]})"
    _agree(why)
    return int(state["step"])


def storable(state: dict[str, Any]) -> dict[str, Any]:
    """`state` with each tensor split chunk by chunk over the tensor-parallel ranks (a
    colwise_fused:K weight and its optimizer state: DTensor's _StridedShard on the innermost mesh
    dimension) gathered whole: torch.distributed.checkpoint describes a rank's part by one offset
    and a size, which such a slice does not have (torch 2.13 refuses it: "overlapping chunks").
    FSDP2's own strided placement (on the data-parallel dimension, outside a plain TP split) it
    reads and writes as it is. Loading into the gathered copy and setting it into the model
    slices it again (set_state_dict copies into the parameter's own placement)."""
    from torch.distributed.tensor import DTensor, Replicate
    from torch.distributed.tensor.placement_types import _StridedShard

    def whole(v: Any) -> Any:
        if isinstance(v, DTensor) and isinstance(v.placements[-1], _StridedShard):
            return v.redistribute(v.device_mesh, [Replicate()] * len(v.placements))
        return storable(v) if isinstance(v, dict) else v

    return {k: whole(v) for k, v in state.items()}


def with_aliases(osd: dict[str, Any], model: nn.Module) -> dict[str, Any]:
    """The flattened optimizer state with each tied parameter's entries under its every name:
    a tied model keys them by its first name only, a pipeline's stages each by the name they
    hold, and a checkpoint of either resumes at the other."""
    from hpctrain.train.checkpoint import tie_aliases

    out = dict(osd)
    for alias, first in tie_aliases(model).items():
        for key, value in osd.items():
            kind, _, rest = key.partition(".")
            name, _, field = rest.rpartition(".")
            if name == first:
                out.setdefault(f"{kind}.{alias}.{field}", value)
    return out


def flat_optimizer(md: Any) -> bool:
    """Does the checkpoint (its metadata; None: unreadable) key its optimizer state by parameter
    name throughout (as save writes it), or hold param_groups by index (hpctrain before
    2026-11-28)?"""
    return md is None or "optimizer.param_groups.0.params" not in md.state_dict_metadata


def _agree(why: str | None) -> None:
    """Raise CheckpointError on every rank if any rank found a problem (the lowest rank's)."""
    import torch.distributed as dist

    whys: list[str | None] = [why]
    if dist.is_initialized():
        whys = [None] * dist.get_world_size()
        dist.all_gather_object(whys, why)
    found = [(rank, w) for rank, w in enumerate(whys) if w is not None]
    if found:
        rank, w = found[0]
        same = all(other == w for _, other in found) and len(found) == len(whys)
        raise CheckpointError(w if same else f"{w} [rank {rank}]")


def _metadata(path: Path) -> tuple[Any, str | None]:
    """(the checkpoint's metadata, None), or (None, why it cannot be read)."""
    from hpctrain.train.dcp_read import read_metadata

    try:
        return read_metadata(path), None
    except Exception as e:  # noqa: BLE001 - truncated, garbage or missing metadata
        if (found := planted(e)) is not None:
            return None, f"was refused and not run: its .metadata holds {found}, not only DCP's records"
        return None, f"is unusable (its metadata: {type(e).__name__}: {str(e)[:120]})"


def _unfit(md: Any, state: dict[str, Any]) -> str | None:
    """Why the checkpoint cannot be loaded into this run's state, judged from its metadata alone."""
    from hpctrain.train.dcp_read import misfit

    problem = misfit(md, state)
    return None if problem is None else f"does not fit this run: {problem}"


def _dcp_load(path: Path, state: dict[str, Any]) -> str | None:
    """DCP's collective read into `state`; a failure on any rank fails it on all (CheckpointException,
    a BaseException: `except Exception` would miss it)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    from hpctrain.train.dcp_read import SafeLoadPlanner, SafeReader

    try:
        dcp.load(state, storage_reader=SafeReader(path), planner=SafeLoadPlanner())
    except CheckpointException as e:
        held = sorted({found for x, _ in e.failures.values() if (found := planted(x)) is not None})
        if held:
            return f"was refused and not run: a shard holds {', '.join(held)}, not only tensors and numbers"
        parts = [
            f"rank {r}: {type(x).__name__}: {str(x)[:80]}".rstrip(": ") for r, (x, _) in e.failures.items()
        ]
        return f"is unusable ({'; '.join(parts)})"
    return None
