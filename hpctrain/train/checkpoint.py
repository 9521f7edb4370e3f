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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from hpctrain import records
from hpctrain.errors import HpctrainError

DIR = records.CHECKPOINTS
KEEP = 2  # older checkpoints are removed once a newer one is complete
STATE_KEYS = ("step", "model", "optimizer", "scaler", "torch_rng")


class Weights(Protocol):
    """What a checkpoint saves and restores of a model: a torch module, or a pipeline rank's
    pieces seen as the whole model (train/pipeline.py StageWeights)."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> Any: ...


class CheckpointError(HpctrainError):
    """Checkpoints exist but none can be used: resuming would silently start over."""


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
    for stale in d.glob(".*"):  # a killed save's temporary files (only rank 0 ever saves)
        stale.unlink(missing_ok=True)
    path = d / f"step-{step:06d}.pt"
    records.write_atomic(path, buf.getvalue())
    records.write_atomic(run_dir / records.LATEST_CHECKPOINT, path.name + "\n")
    for old in sorted(d.glob("step-*.pt"))[:-KEEP]:
        old.unlink(missing_ok=True)
    return path


def latest(run_dir: Path) -> Path | None:
    pointer = run_dir / records.LATEST_CHECKPOINT
    if not pointer.exists():
        return None
    path = run_dir / DIR / pointer.read_text().strip()
    return path if path.exists() else None


def load(path: Path, model: Weights, optimizer: Any, scaler: torch.amp.GradScaler | None) -> int:
    """Restore the states from one checkpoint; return the step to resume at."""
    return _apply(path, torch.load(path, map_location="cpu", weights_only=False), model, optimizer, scaler)


def candidates(run_dir: Path) -> tuple[list[Path], list[str]]:
    """Checkpoints to try, in order: the one `latest` names, then the others newest first; and
    what is wrong with the pointer, if anything."""
    d, pointer = run_dir / DIR, run_dir / records.LATEST_CHECKPOINT
    found = sorted(d.glob("step-*.pt"), reverse=True)
    notes: list[str] = []
    if pointer.exists():
        named = d / pointer.read_text(errors="replace").strip()
        if named.is_file() and named.parent == d:
            found = [named, *(p for p in found if p != named)]
        else:
            notes.append(f"{pointer} names {named.name!r}, which does not exist")
    return found, notes


def restore(run_dir: Path, model: Weights, optimizer: Any, scaler: torch.amp.GradScaler | None) -> Restored:
    """Load the newest usable checkpoint into the states; a fresh start only if there is none."""
    found = newest(run_dir, STATE_KEYS)
    if found is None:
        return Restored(0, None, [])
    path, state, skipped = found
    return Restored(_apply(path, state, model, optimizer, scaler), path, skipped)


def newest(run_dir: Path, keys: tuple[str, ...]) -> tuple[Path, dict[str, Any], list[str]] | None:
    """The newest checkpoint that loads and holds `keys`, and what was skipped; None if there is
    none at all; CheckpointError if there are some but none is usable."""
    paths, skipped = candidates(run_dir)
    for path in paths:
        try:
            state = torch.load(path, map_location="cpu", weights_only=False)
            if not isinstance(state, dict) or any(k not in state for k in keys):
                raise ValueError("not an hpctrain checkpoint")
        except Exception as e:  # noqa: BLE001 - truncated, corrupt or foreign: try the next one
            skipped.append(f"{path.name} is unusable ({type(e).__name__}: {str(e)[:120]})")
            continue
        return path, state, skipped
    if skipped:
        raise CheckpointError(
            f"no usable checkpoint in {run_dir / DIR}: {'; '.join(skipped)}. Starting again from step 0 "
            "would discard this run's progress; to do that on purpose, remove the checkpoints directory"
        )
    return None


def _apply(path: Path, state: dict[str, Any], model: Weights, optimizer: Any, scaler: Any) -> int:
    try:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        if scaler is not None and state["scaler"] is not None:
            scaler.load_state_dict(state["scaler"])
        torch.set_rng_state(state["torch_rng"])
    except (RuntimeError, KeyError, ValueError) as e:
        raise CheckpointError(f"{path} does not fit this run's model or optimizer: {e}") from e
    return int(state["step"])
