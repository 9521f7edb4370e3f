"""train.resume_from must name a checkpoint before anything starts: a step-*.pt file, a complete
step-*.dcp directory (sharded), or a run directory that holds checkpoints (its latest is used)."""

from __future__ import annotations

from pathlib import Path

from hpctrain import records
from hpctrain.config.layout import PIPELINED
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
        return _format_problems(cfg, [path])
    d = path / records.CHECKPOINTS
    found = [*d.glob("step-*.pt"), *d.glob("step-*.dcp")] if path.is_dir() else []
    if found:
        return _format_problems(cfg, found)
    return [
        Problem(
            key,
            f"{given} is neither a checkpoint nor a run directory with checkpoints (runs write them "
            "every cluster.checkpoint_interval steps, and when SLURM stops them)",
            FIX,
        )
    ]


def _format_problems(cfg: Config, found: list[Path]) -> list[Problem]:
    """A pipeline's stages load whole tensors with the optimizer state by index; a sharded run's
    checkpoints (.dcp) hold it by parameter name, resharded only into fsdp/hsdp or one rank."""
    if cfg.parallelism.name not in PIPELINED or any(p.suffix == ".pt" for p in found):
        return []
    return [
        Problem(
            "train.resume_from",
            f"{cfg.train.resume_from} holds only sharded checkpoints (fsdp/hsdp), which a pipeline cannot resume from",
            "resume it with parallelism=fsdp (or data), or start the pipeline without train.resume_from",
        )
    ]
