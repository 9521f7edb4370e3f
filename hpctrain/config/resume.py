"""train.resume_from must name a checkpoint before anything starts: a step-*.pt file, a complete
step-*.dcp directory (sharded), or a run directory that holds checkpoints (its latest is used)."""

from __future__ import annotations

from pathlib import Path

from hpctrain import records
from hpctrain.config.schema import Config
from hpctrain.errors import Problem

FIX = "give a checkpoint (checkpoints/step-*.pt, checkpoints/step-*.dcp) or a run directory that holds some"


def resume_problems(cfg: Config) -> list[Problem]:
    given = cfg.train.resume_from
    if not given:
        return []
    path = Path(given).expanduser()
    key = "train.resume_from"
    if not path.exists():
        return [Problem(key, f"{given} does not exist", FIX)]
    if path.name.startswith("step-") and path.suffix in (".pt", ".dcp"):
        if path.suffix == ".dcp" and not (path / ".metadata").is_file():
            return [Problem(key, f"{given} is a partial sharded checkpoint (no .metadata)", FIX)]
        return []
    if resume_checkpoints(cfg):
        return []
    return [
        Problem(
            key,
            f"{given} is neither a checkpoint nor a run directory with checkpoints (runs write them "
            "every cluster.checkpoint_interval steps, and when SLURM stops them)",
            FIX,
        )
    ]


def resume_checkpoints(cfg: Config) -> list[Path]:
    """The checkpoints train.resume_from names (one file or directory, or a run's), if any."""
    given = cfg.train.resume_from
    if not given:
        return []
    path = Path(given).expanduser()
    if path.name.startswith("step-") and path.suffix in (".pt", ".dcp"):
        return [path] if path.exists() else []
    d = path / records.CHECKPOINTS
    return [*d.glob("step-*.pt"), *d.glob("step-*.dcp")] if path.is_dir() else []
