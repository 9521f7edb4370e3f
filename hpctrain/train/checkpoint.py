"""Checkpoints: written atomically by rank 0, read by every rank on restart.

    checkpoints/step-000120.pt   model, optimizer, grad scaler, next step, RNG states
    checkpoints/latest           the file name of the newest complete checkpoint

The checkpoint is written to a temporary file and renamed, then `latest` is replaced the same
way, so a crash at any moment leaves `latest` pointing at a complete checkpoint.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import torch

from .. import records

DIR = records.CHECKPOINTS
KEEP = 2  # older checkpoints are removed once a newer one is complete


def save(
    run_dir: Path, step: int, model: torch.nn.Module, optimizer: Any, scaler: torch.amp.GradScaler | None
) -> Path:
    """Save the state *after* `step` steps (training resumes at step `step`)."""
    state = {
        "step": step,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scaler": scaler.state_dict() if scaler is not None else None,
        "torch_rng": torch.get_rng_state(),
    }
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


def load(path: Path, model: torch.nn.Module, optimizer: Any, scaler: torch.amp.GradScaler | None) -> int:
    """Restore the states; return the step to resume at."""
    state = torch.load(path, map_location="cpu", weights_only=False)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    if scaler is not None and state["scaler"] is not None:
        scaler.load_state_dict(state["scaler"])
    torch.set_rng_state(state["torch_rng"])
    return int(state["step"])
