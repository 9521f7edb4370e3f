"""What every launcher's plan shares: the rank environment table, and the marker for values that
only the launcher knows when it starts the ranks."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hpctrain.engine.registry import engine_class, engine_names

if TYPE_CHECKING:  # the local supervisor imports AT_LAUNCH without the config (and Hydra's)
    from hpctrain.config.schema import Config

AT_LAUNCH = "<chosen at launch>"  # a value only the launcher knows when it starts the ranks


def rank_env(cfg: Config, threads: int) -> dict[str, str]:
    """The one table of settings -> environment variables for every rank: the engine's own (a
    script may use any framework: every engine's), threads, then the user's cluster.env."""
    names = engine_names() if cfg.script.path else [str(cfg.parallelism.engine)]
    env: dict[str, str] = {}
    for name in names:
        env.update(engine_class(name).rank_env(cfg))
    # torch and OpenMP would otherwise each start one thread per core in every rank
    env["OMP_NUM_THREADS"] = str(threads)
    env.update({k: str(v) for k, v in cfg.cluster.env.items()})
    return env
