"""Every rule a run must pass before anything is written or submitted: the configuration's own,
and those each axis adds (the launcher's cluster rules, the engine's, the workload's and the
parallelism's). Each problem names the key, the rule and the fix; all are reported at once."""

from __future__ import annotations

from collections.abc import Sequence

from hpctrain.config.derived import world_size
from hpctrain.config.schema import Config
from hpctrain.config.validate import config_problems
from hpctrain.config.values import sections_shared
from hpctrain.engine.registry import engine_problems
from hpctrain.errors import ConfigError, Problem
from hpctrain.facts import HostFacts
from hpctrain.launch.container import container_problems
from hpctrain.launch.registry import launcher_class
from hpctrain.parallel.elastic import elastic_problems
from hpctrain.parallel.rules import parallelism_problems
from hpctrain.workload.rules import workload_problems


def problems(cfg: Config, facts: HostFacts | None = None) -> list[Problem]:
    """`facts` enables the checks against the host the ranks run on (local launches)."""
    p = config_problems(cfg, facts)
    p += launcher_class(cfg.cluster.name).problems(cfg)
    p += engine_problems(cfg)
    p += workload_problems(cfg)
    p += parallelism_problems(cfg, world_size(cfg), facts)
    p += elastic_problems(cfg)
    p += container_problems(cfg)  # the runtime and image on this host (nothing asked without one)
    return p


def validate(cfg: Config, facts: HostFacts | None = None) -> None:
    """Raise ConfigError listing every broken rule."""
    found = problems(cfg, facts)
    if found:
        raise ConfigError(found)


def validate_points(configs: Sequence[Config], labels: Sequence[str], facts: HostFacts | None) -> None:
    """Validate every point of a sweep or study; one ConfigError lists each broken rule once, with
    the points that break it, so nothing starts while any point is invalid."""
    where: dict[Problem, list[str]] = {}
    with sections_shared():
        for cfg, label in zip(configs, labels):
            for p in problems(cfg, facts):
                where.setdefault(p, []).append(label)
    if where:
        raise ConfigError([Problem(p.key, p.rule, p.fix, ", ".join(pts)) for p, pts in where.items()])
