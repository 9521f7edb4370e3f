"""Engines by name, as launchers are (launch/registry.py). `parallelism.engine` picks one.

Adding an engine (say `fsdp`): a module hpctrain/engine/fsdp.py with a class that implements
engine.base.Engine (plus engine.base.StageReplicas if it can average pipeline stages), and one
line in ENGINES below. Its settings, rules, rank environment and gradient grouping are class
attributes and class methods of that class; nothing else changes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hpctrain.errors import Problem
from hpctrain.registry import Registry

if TYPE_CHECKING:
    from hpctrain.config.schema import Config
    from hpctrain.engine.base import Engine
    from hpctrain.records import Layout

# name -> "module:Class"; imported on first use, so planning one engine never loads another
ENGINES: dict[str, str] = {
    "horovod": "hpctrain.engine.horovod:HorovodEngine",
    "ddp": "hpctrain.engine.ddp:DdpEngine",
}
_REGISTRY: Registry[Engine[Any]] = Registry(
    "engine", ENGINES, "hpctrain.engines", base="hpctrain.engine.base:Engine"
)


def engine_names() -> list[str]:
    """The built-in engines, then those other installed packages register (entry points)."""
    return _REGISTRY.names()


def register_engine(name: str, target: str) -> None:
    """Make `target` ("package.module:Class") available as parallelism.engine=`name`."""
    _REGISTRY.register(name, target)


def unknown_engine(key: str, name: str) -> Problem:
    return _REGISTRY.unknown(key, name)


def engine_class(name: str) -> type[Engine[Any]]:
    return _REGISTRY.get(name, "parallelism.engine")


def engines_with(capability: type) -> list[str]:
    """The registered engines that have a capability (engine/base.py: Sharding, ...)."""
    return [n for n in engine_names() if issubclass(engine_class(n), capability)]


def lacks(name: str, capability: type) -> bool:
    """A registered engine without the capability (an unknown name is reported elsewhere)."""
    return name in _REGISTRY and not issubclass(engine_class(name), capability)


def engine_for(cfg: Config) -> Engine[Any]:
    """The configured engine, built on a rank with the run's wiring and its own settings."""
    return _built(engine_class(str(cfg.parallelism.engine)), cfg)


def _built(engine: type[Engine[Any]], cfg: Config) -> Engine[Any]:
    from hpctrain.engine.base import EngineRun, own_settings

    return engine(EngineRun.of(cfg), own_settings(engine, cfg))


def engine_on_ranks(cfg: Config, layout: Layout) -> Engine[Any]:
    """The engine the ranks start: the configured one, except where the layout leaves it nothing to
    average (one replica, one shard, no named dimension: a pure pipeline), where the ranks only
    coordinate (agree to stop, gather their records) over torch.distributed, which such a layout
    starts for itself, and no engine of its own starts: Horovod's background thread spins in MPI
    with nothing to send (29-36% of a core per rank, issue 74)."""
    configured = engine_class(str(cfg.parallelism.engine))
    if configured.torch_group or layout.world_size == 1 or layout.replicas * layout.shard * layout.inner > 1:
        return _built(configured, cfg)
    return _built(next(c for n in engine_names() if (c := engine_class(n)).torch_group), cfg)


def engine_problems(cfg: Config) -> list[Problem]:
    """The chosen engine's rules, and refusals of other engines' settings (a study that compares
    engines checks each of its points, one engine each)."""
    from hpctrain.engine.base import Timeline, foreign_settings

    name = str(cfg.parallelism.engine)
    if name not in _REGISTRY:
        return [unknown_engine("parallelism.engine", name)]
    engine = engine_class(name)
    others = [engine_class(n) for n in engine_names() if n != name]
    p = engine.problems(cfg) + foreign_settings(cfg, engine, others)
    if cfg.profile.horovod_timeline and not issubclass(engine, Timeline):
        p.append(
            Problem(
                "profile.horovod_timeline",
                f"is a timeline engine {name} does not record (engines that do: "
                f"{', '.join(engines_with(Timeline))})",
                "drop profile.horovod_timeline (the torch.profiler trace shows torch.distributed's collectives)",
            )
        )
    return p


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
