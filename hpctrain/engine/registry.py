"""Engines by name, as launchers are (launch/registry.py). `parallelism.engine` picks one.

Adding an engine (say `fsdp`): a module hpctrain/engine/fsdp.py with a class that implements
engine.base.Engine (plus engine.base.StageReplicas if it can average pipeline stages), and one
line in ENGINES below. Its settings, rules, rank environment and gradient grouping are class
attributes and class methods of that class; nothing else changes.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from hpctrain.errors import ConfigError, Problem

if TYPE_CHECKING:
    from hpctrain.config.schema import Config
    from hpctrain.engine.base import Engine

# name -> "module:Class"; imported on first use, so planning one engine never loads another
ENGINES: dict[str, str] = {
    "horovod": "hpctrain.engine.horovod:HorovodEngine",
    "ddp": "hpctrain.engine.ddp:DdpEngine",
}
_LOADED: dict[str, type[Engine]] = {}


def register_engine(name: str, target: str) -> None:
    """Make `target` ("package.module:Class") available as parallelism.engine=`name`."""
    ENGINES[name] = target
    _LOADED.pop(name, None)


def unknown_engine(key: str, name: str) -> Problem:
    names = ", ".join(ENGINES)
    return Problem(key, f"no engine named {name!r}: not one of {names}", f"use one of: {names}")


def engine_class(name: str) -> type[Engine]:
    if name not in ENGINES:
        raise ConfigError([unknown_engine("parallelism.engine", name)])
    if name not in _LOADED:
        module, _, cls_name = ENGINES[name].partition(":")
        cls: type[Engine] = getattr(importlib.import_module(module), cls_name)
        cls.name = name
        _LOADED[name] = cls
    return _LOADED[name]


def engine_for(name: str) -> Engine:
    return engine_class(name)()


def engine_problems(cfg: Config) -> list[Problem]:
    """The chosen engine's rules, and refusals of other engines' settings (a study that compares
    engines checks each of its points, one engine each)."""
    from hpctrain.engine.base import foreign_settings

    name = str(cfg.parallelism.engine)
    if name not in ENGINES:
        return [unknown_engine("parallelism.engine", name)]
    from hpctrain.engine.base import Sharding, StageReplicas

    engine = engine_class(name)
    others = [engine_class(n) for n in ENGINES if n != name]
    p = engine.problems(cfg) + foreign_settings(cfg, engine, others)
    if cfg.parallelism.name in ("fsdp", "hsdp") and not issubclass(engine, Sharding):
        able = ", ".join(n for n in ENGINES if issubclass(engine_class(n), Sharding))
        p.append(
            Problem(
                "parallelism.engine",
                f"parallelism={cfg.parallelism.name} shards with torch.distributed's FSDP2; engine "
                f"{engine.name} cannot shard a model",
                f"set parallelism.engine to one of: {able} (or use parallelism=data with {engine.name})",
            )
        )
    if cfg.parallelism.name == "hybrid" and not issubclass(engine, StageReplicas):
        able = ", ".join(n for n in ENGINES if issubclass(engine_class(n), StageReplicas))
        p.append(
            Problem(
                "parallelism.engine",
                f"engine {engine.name} cannot average a pipeline stage over its replicas (hybrid)",
                f"use parallelism=pipeline, or one of these engines: {able}",
            )
        )
    return p


def needs_torch_store(cfg: Config) -> bool:
    """torch.distributed may run and needs MASTER_ADDR/MASTER_PORT: an engine that uses it, a
    user script, a pipeline (its stages talk point to point over torch.distributed whatever the
    engine), or the allreduce benchmark (it times torch.distributed too)."""
    return (
        bool(cfg.script.path)
        or cfg.bench.allreduce
        or cfg.parallelism.name != "data"
        or engine_class(str(cfg.parallelism.engine)).needs_torch_store(cfg)
    )


def needs_mpi(cfg: Config) -> bool:
    """The ranks need MPI: the engine says so (Horovod over MPI), or the allreduce benchmark (it
    times mpi4py and meets with MPI's barrier). A user script may or may not: it is not asked."""
    if cfg.script.path:
        return False
    return cfg.bench.allreduce or engine_class(str(cfg.parallelism.engine)).needs_mpi(cfg)


def needs_gloo_rendezvous(cfg: Config) -> bool:
    """Horovod may run over Gloo and needs the launcher's rendezvous: an engine that asks for it,
    or a user script (which may be a Horovod script) with backend=gloo."""
    if cfg.script.path:
        return cfg.parallelism.backend == "gloo"
    return engine_class(str(cfg.parallelism.engine)).needs_gloo_rendezvous(cfg)
