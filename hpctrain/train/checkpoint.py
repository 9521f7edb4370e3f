"""Checkpoints: written atomically by rank 0, read by every rank on restart.

    checkpoints/step-000120.pt   model, optimizer, grad scaler, next step, RNG states
    checkpoints/latest           the file name of the newest complete checkpoint

The checkpoint is written to a temporary file and renamed, then `latest` is replaced the same
way, so a crash at any moment leaves `latest` pointing at a complete checkpoint. A restart still
does not trust it blindly (a disk can lose or truncate a file): `restore` tries the file `latest`
names, then every other checkpoint newest first, says which it skipped and why, and stops with an
error naming the files rather than start again from step 0 over an earlier attempt's records.
"""

from __future__ import annotations

import io
import pickle
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from hpctrain import bounded, records
from hpctrain.errors import HpctrainError

DIR = records.CHECKPOINTS
KEEP = 2  # older checkpoints are removed once a newer one is complete
STATE_KEYS = ("step", "model", "optimizer", "scaler", "torch_rng")
SUFFIX = (
    ".dcp"  # a sharded checkpoint: a directory (train/shard_checkpoint.py; records.published_checkpoints)
)
WRAPPED = "_checkpoint_wrapped_module"  # activation checkpointing's wrapper holds a block here


class Weights(Protocol):
    """What a checkpoint saves and restores of a model: a torch module, or a pipeline rank's
    pieces seen as the whole model (parallel/pipeline/pipe.py StageWeights)."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> Any: ...


class CheckpointError(HpctrainError):
    """Checkpoints exist but none can be used: resuming would silently start over."""

    quiet = True  # the message says all there is: a rank reports it without hpctrain's stack


@dataclass(frozen=True)
class Restored:
    step: int  # the step to resume at (0: a fresh start)
    path: Path | None  # the checkpoint used
    skipped: list[str] = field(default_factory=list)  # what was not usable, and why


def save(
    run_dir: Path, step: int, model: Weights, optimizer: Any, scaler: torch.amp.GradScaler | None
) -> Path:
    """Save the state *after* `step` steps (training resumes at step `step`)."""
    state = {
        "step": step,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scaler": scaler.state_dict() if scaler is not None else None,
        "torch_rng": torch.get_rng_state(),
    }
    return write(run_dir, step, state)


def write(run_dir: Path, step: int, state: dict[str, Any]) -> Path:
    """Write one checkpoint atomically, point `latest` at it, drop all but the newest KEEP."""
    buf = io.BytesIO()
    torch.save(state, buf)
    d = run_dir / DIR
    path = d / f"step-{step:06d}.pt"
    records.write_atomic(path, buf.getvalue())
    records.write_atomic(run_dir / records.LATEST_CHECKPOINT, path.name + "\n")
    prune(d)
    return path


def save_failure(path: Path, e: BaseException) -> CheckpointError:
    """Why writing the checkpoint at `path` failed, in words: a full file system is named as such
    (torch's zip writer reports it as 'unexpected pos'), with the space left there."""
    try:
        free: int | None = shutil.disk_usage(path.parent).free
    except OSError:
        free = None
    chain: list[BaseException] = [x for x, _ in getattr(e, "failures", {}).values()]  # DCP's, per rank
    cur: BaseException | None = e
    while cur is not None and len(chain) < 50:
        chain.append(cur)
        cur = cur.__cause__ or cur.__context__
    full = any(getattr(x, "errno", None) == 28 for x in chain) or (free is not None and free < 1 << 20)
    said = (
        "[Errno 28] No space left on device"
        if full
        else f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
    )
    left = f" ({free} bytes free there)" if free is not None else ""
    return CheckpointError(f"writing checkpoint {path} failed: {said}{left}")


def prune(d: Path) -> None:
    """Remove a killed save's hidden parts and all but the newest KEEP checkpoints, of either
    format (only rank 0 ever publishes a checkpoint)."""
    for stale in d.glob(".*"):
        _remove(stale)
    for old in sorted(records.published_checkpoints(d), key=lambda p: p.stem)[:-KEEP]:
        _remove(old)


def _remove(p: Path) -> None:
    if p.is_dir():
        shutil.rmtree(p, ignore_errors=True)
    else:
        p.unlink(missing_ok=True)


def latest(run_dir: Path) -> Path | None:
    pointer = run_dir / records.LATEST_CHECKPOINT
    if not pointer.exists():
        return None
    path = run_dir / DIR / bounded.read_text(pointer, bounded.SMALL, errors="replace").strip()
    return path if path.exists() else None


class UnsafeCheckpoint(CheckpointError):
    """A checkpoint that holds Python objects beyond tensors, numbers and containers: unpickling it
    could run any code its author put there (train.resume_from on a shared file system)."""

    def __init__(self, path: Path, found: str) -> None:
        self.path = path
        self.found = found  # what it holds that hpctrain never writes (torch names the global)
        super().__init__(
            f"{path} holds more than tensors, numbers and state dicts ({found}): refused and not run; "
            "hpctrain's own checkpoints hold nothing else, so someone else wrote this one"
        )


def read_state(path: Path) -> Any:
    """A .pt checkpoint's contents, unpickled with torch's weights_only loader: tensors, numbers,
    strings and containers only, which is all hpctrain writes; anything else (a callable, a
    class) is refused, never run (torch.load's default since 2.6, for this reason)."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        found = planted(e)
        if found is None:
            raise
        raise UnsafeCheckpoint(path, found) from e


def planted(e: BaseException) -> str | None:
    """The callable or class a refused unpickle named (torch's weights_only loader and dcp_read
    both say 'GLOBAL module.name'); None for other errors, which are damage (truncated, garbage)."""
    named = re.search(r"GLOBAL (\S+)", str(e)) if isinstance(e, pickle.UnpicklingError) else None
    return None if named is None else named.group(1)


def load(path: Path, model: Weights, optimizer: Any, scaler: torch.amp.GradScaler | None) -> int:
    """Restore the states from one checkpoint; return the step to resume at."""
    return _apply(path, read_state(path), model, optimizer, scaler)


def candidates(run_dir: Path, resume_from: str | None = None) -> tuple[list[Path], list[str]]:
    """Checkpoints to try, in order: the one `latest` names, then the others newest first; and
    what is wrong with the pointer, if anything. Without any of its own, a run starts from
    `resume_from` (train.resume_from): that checkpoint, or another run directory's."""
    found, notes = _own(run_dir)
    if found or not resume_from:
        return found, notes
    src = Path(resume_from)
    if src.name.startswith("step-"):
        return [src], notes
    return _own(src)


def _own(run_dir: Path) -> tuple[list[Path], list[str]]:
    d, pointer = run_dir / DIR, run_dir / records.LATEST_CHECKPOINT
    found = sorted(records.published_checkpoints(d), key=lambda p: p.stem, reverse=True)
    notes: list[str] = []
    if pointer.exists():
        try:
            named: Path | None = d / bounded.read_text(pointer, bounded.SMALL, errors="replace").strip()
        except OSError as e:  # a planted giant or a FIFO names no checkpoint
            named = None
            notes.append(f"{pointer} cannot be read ({e.strerror})")
        if named is not None and named.exists() and named.parent == d and named.name.startswith("step-"):
            found = [named, *(p for p in found if p != named)]
        elif named is not None:
            notes.append(f"{pointer} names {named.name!r}, which does not exist")
    return found, notes


def restore(
    run_dir: Path,
    model: Weights,
    optimizer: Any,
    scaler: torch.amp.GradScaler | None,
    resume_from: str | None = None,
) -> Restored:
    """Load the newest usable checkpoint into the states; a fresh start only if there is none."""
    found = newest(run_dir, STATE_KEYS, resume_from)
    if found is None:
        return Restored(0, None, [])
    path, state, skipped = found
    return Restored(_apply(path, state, model, optimizer, scaler), path, skipped)


def newest(
    run_dir: Path, keys: tuple[str, ...], resume_from: str | None = None
) -> tuple[Path, dict[str, Any], list[str]] | None:
    """The newest checkpoint that loads and holds `keys`, and what was skipped; None if there is
    none at all; CheckpointError if there are some but none is usable."""
    paths, skipped = candidates(run_dir, resume_from)
    for path in paths:
        state, why = read_usable(path, keys)
        if why is not None:  # truncated, corrupt, foreign or planted: try the next one
            skipped.append(f"{path.name} {why}")
            continue
        return path, state, skipped
    if skipped:
        raise none_usable(paths, run_dir, skipped)
    return None


def read_usable(path: Path, keys: tuple[str, ...]) -> tuple[dict[str, Any], str | None]:
    """A checkpoint of either format read whole, and why it cannot be used (None: it can): it
    does not load, lacks `keys`, or carries code (said in full: someone planted it)."""
    try:
        state = load_any(path)
        if not isinstance(state, dict) or any(k not in state for k in keys):
            raise ValueError("not an hpctrain checkpoint")
    except UnsafeCheckpoint as e:
        return {}, f"was refused and not run: it holds {e.found}, not only tensors"
    except Exception as e:  # noqa: BLE001 - truncated, corrupt or foreign
        return {}, f"is unusable ({type(e).__name__}: {str(e)[:120]})"
    return state, None


def none_usable(paths: list[Path], run_dir: Path, skipped: list[str]) -> CheckpointError:
    where = paths[0].parent if paths else run_dir / DIR
    fix = (
        "resume with the model and optim settings of the run that wrote them (its config.yaml)"
        if any(" does not fit " in s for s in skipped)
        else "starting again from step 0 would discard this run's progress; to do that on purpose, "
        "remove the checkpoints directory"
    )
    return CheckpointError(f"no usable checkpoint in {where}: {'; '.join(skipped)}. To go on: {fix}")


def load_any(path: Path) -> dict[str, Any]:
    """A checkpoint of either format as one full state (a sharded one has no grad scaler)."""
    if path.is_dir():
        return {"scaler": None, **read_full(path)}
    state: dict[str, Any] = read_state(path)
    return state


def _apply(path: Path, state: dict[str, Any], model: Weights, optimizer: Any, scaler: Any) -> int:
    try:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(_by_index_if_named(path, state["optimizer"], model))
        if scaler is not None and state["scaler"] is not None:
            scaler.load_state_dict(state["scaler"])
        torch.set_rng_state(state["torch_rng"])
    except (RuntimeError, KeyError, ValueError) as e:
        raise CheckpointError(f"{path} does not fit this run's model or optimizer: {e}") from e
    return int(state["step"])


def _by_index_if_named(path: Path, osd: dict[str, Any], model: Weights) -> dict[str, Any]:
    """A sharded run's optimizer state (by parameter name) for a plain optimizer (by index)."""
    if isinstance(model, nn.Module) and any(k.startswith("param_groups.") for k in osd):
        aliases = tie_aliases(model)  # state kept under a tie's other names: the same values
        osd = unflatten(
            {k: v for k, v in osd.items() if k.split(".", 1)[1].rpartition(".")[0] not in aliases},
            param_names(model),
        )
    if not any(isinstance(k, str) for k in osd.get("state", {})):
        return osd
    if not isinstance(model, nn.Module):
        raise CheckpointError(
            f"{path} was written by a sharded run (fsdp/hsdp); a pipeline cannot resume from it: "
            "resume with parallelism=fsdp or data"
        )
    return by_index(osd, param_names(model))


def clean_name(name: str) -> str:
    """A parameter's name without activation checkpointing's wrapper (as state dicts have it)."""
    return name.replace(f".{WRAPPED}", "").replace(f"{WRAPPED}.", "")


def param_names(model: nn.Module) -> list[str]:
    return [clean_name(n) for n, _ in model.named_parameters()]


def tie_aliases(model: nn.Module) -> dict[str, str]:
    """Each further name of a tied parameter, with the name the model lists it by (its first):
    a layout that held the tie's copies apart (a pipeline's stages) kept optimizer state under
    every name, all equal (engine/ties.py)."""
    from hpctrain.engine.ties import tied_groups

    return {clean_name(n): clean_name(tie[0]) for tie in tied_groups(model) for n in tie[1:]}


def read_full(path: Path) -> dict[str, Any]:
    """A DCP checkpoint as one full state (every tensor whole), read in this process alone: what
    torch's own dcp_to_torch_save does (torch.distributed.checkpoint.format_utils)."""
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    from hpctrain.train.dcp_read import SafeReader, SafeWholePlanner, read_metadata

    if not (path / ".metadata").is_file():
        raise ValueError("no .metadata: not a complete checkpoint")
    try:
        read_metadata(path)  # first, alone: DCP would wrap its refusal in an AssertionError
    except pickle.UnpicklingError as e:
        if (found := planted(e)) is not None:
            raise UnsafeCheckpoint(path / ".metadata", found) from e
        raise
    state: dict[str, Any] = {}
    try:
        _load_state_dict(state, storage_reader=SafeReader(path), planner=SafeWholePlanner(), no_dist=True)
    except CheckpointException as e:  # a BaseException: surfaced as the damage it reports
        first = next(iter(e.failures.values()))[0]
        if (found := planted(first)) is not None:
            raise UnsafeCheckpoint(path, found) from e
        raise ValueError(f"{type(first).__name__}: {first}") from e
    return state


def by_name(osd: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """torch.optim's state dict (parameters by index) keyed by parameter name instead."""
    return {
        "state": {names[int(i)]: s for i, s in osd["state"].items()},
        "param_groups": [{**g, "params": [names[int(i)] for i in g["params"]]} for g in osd["param_groups"]],
    }


def unflatten(flat: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """An optimizer state flattened by parameter name ("state.NAME.KEY", "param_groups.NAME.KEY":
    torch.distributed.checkpoint.state_dict's flatten_optimizer_state_dict, as sharded checkpoints
    are written) as torch.optim's by name: its groups are the parameters, in the model's order,
    that share every hyperparameter."""
    state: dict[str, dict[str, Any]] = {}
    hyper: dict[str, dict[str, Any]] = {}
    for key, value in flat.items():
        kind, _, rest = key.partition(".")
        name, _, field = rest.rpartition(".")
        (state if kind == "state" else hyper).setdefault(name, {})[field] = value
    groups: dict[str, dict[str, Any]] = {}
    for name in names:
        if name in hyper:
            same = repr(sorted(hyper[name].items()))
            groups.setdefault(same, {**hyper[name], "params": []})["params"].append(name)
    return {"state": state, "param_groups": list(groups.values())}


def by_index(osd: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """The reverse: a state keyed by parameter name as torch.optim's (by index)."""
    index = {n: i for i, n in enumerate(names)}
    return {
        "state": {index[n]: s for n, s in osd["state"].items()},
        "param_groups": [{**g, "params": [index[n] for n in g["params"]]} for g in osd["param_groups"]],
    }


def writers(path: Path) -> int:
    """How many ranks wrote a checkpoint (a sharded one: one file each; a whole one: 0, unknown)."""
    return len(list(path.glob("__*_*.distcp"))) if path.is_dir() else 0
