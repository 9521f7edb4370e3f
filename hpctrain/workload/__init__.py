"""The workload axis: what every rank runs.

    built-in trainer   hpctrain's loop on its own models and data (train/)
    user targets       the same loop on the user's model, data or loss by import path
                       (model._target_=..., Hydra's instantiate): train/targets.py
    user script        any Horovod or torch.distributed script, run as __main__ on every rank,
                       optionally reporting through hpctrain.api: script.py
    allreduce          the allreduce benchmark (bench.allreduce=true): allreduce.py

code.py puts the user's code on every rank's path (and snapshots it for queued jobs);
engine/world.py gives a script the environment its framework expects.
"""

from __future__ import annotations

from pathlib import Path

from hpctrain.config.schema import Config


def kind(cfg: Config) -> str:
    """allreduce | script | targets | builtin"""
    if cfg.bench.allreduce:
        return "allreduce"
    if cfg.script.path:
        return "script"
    return "targets" if cfg.user_code else "builtin"


def workload_env(cfg: Config, home: Path) -> dict[str, str]:
    """Variables every rank gets for the workload (pure): where the user's code and script are.
    `home`: the run directory, or the sweep directory whose runs share one code snapshot."""
    from hpctrain.workload.code import CODE_DIR_VAR, code_location, script_location
    from hpctrain.workload.script import SCRIPT_VAR

    code = code_location(cfg, home)
    env: dict[str, str] = {}
    if code is not None:
        env[CODE_DIR_VAR] = code
    script = script_location(cfg, code)
    if script is not None:
        env[SCRIPT_VAR] = script
    return env


def workload_notes(cfg: Config) -> list[str]:
    """What the dry run should say about the workload."""
    from hpctrain.workload.code import snapshot_on

    notes = []
    if cfg.script.path:
        notes.append(
            f"runs the script {cfg.script.path} on every rank (model, data, precision and optim "
            "settings are the script's own business)"
        )
    if snapshot_on(cfg):
        notes.append(f"code.dir={cfg.code.dir} is copied into the run at submission; the job runs that copy")
    return notes
