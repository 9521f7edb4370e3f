"""Every rule a run must pass before anything is written or submitted: the configuration's own,
and those each axis adds (the launcher's cluster rules, the engine's, the workload's and the
parallelism's). Each problem names the key, the rule and the fix; all are reported at once."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Sequence

from hpctrain.analysis.memory import Limit
from hpctrain.config.derived import world_size
from hpctrain.config.schema import Config
from hpctrain.config.validate import config_problems
from hpctrain.config.values import sections_shared
from hpctrain.engine.registry import engine_problems
from hpctrain.errors import ConfigError, Problem
from hpctrain.facts import HostFacts
from hpctrain.launch.base import Launcher
from hpctrain.launch.container import container_problems
from hpctrain.launch.registry import launcher_class
from hpctrain.parallel.elastic import elastic_problems
from hpctrain.parallel.rules import parallelism_problems
from hpctrain.records import MemoryBound
from hpctrain.workload.rules import workload_problems

SLOW_TRACE_S = 10.0  # a memory trace longer than this is said to be running


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
        raise by_point(where)


def by_point(where: dict[Problem, list[str]]) -> ConfigError:
    """One error naming each problem once, with the points that have it (unnamed: the one run)."""
    return ConfigError(
        [Problem(p.key, p.rule, p.fix, ", ".join(x for x in pts if x)) for p, pts in where.items()]
    )


def memory_key(cfg: Config) -> str:
    """Points whose memory is the same: all but where they run and how long."""
    from hpctrain.config import to_yaml

    train = dataclasses.replace(cfg.train, steps=1, warmup_steps=0)
    return to_yaml(dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, dir=None), train=train))


def trains(cfg: Config) -> bool:
    """Whether the point runs hpctrain's trainer: a script, the allreduce benchmark and a
    pre-flight check alone hold memory no trace of the model sees."""
    return not (cfg.script.path or cfg.bench.allreduce or cfg.cluster.preflight.only)


def limited(
    launcher: Launcher, configs: Sequence[Config], labels: Sequence[str]
) -> list[tuple[Config, str, Limit]]:
    """The points whose memory is checked before the start: they run hpctrain's trainer and the
    launcher says how much each rank has and enforces it (a GPU's memory,
    cluster.memory_per_rank_gib, SLURM's mem_gb); one of each set of identical points (a study's
    repetitions)."""
    out, seen = [], set()
    for cfg, label in zip(configs, labels):
        limit = launcher.memory_per_rank(cfg)
        if limit is None or not limit.checked or not trains(cfg):
            continue
        key = memory_key(cfg)
        if key not in seen:
            seen.add(key)
            out.append((cfg, label, limit))
    return out


def check_memory(
    launcher: Launcher, configs: Sequence[Config], labels: Sequence[str], say: Callable[[str], None]
) -> dict[str, MemoryBound]:
    """Refuse, before anything exists, the points predicted to need more memory per rank than
    each has (memory/predict.py); one ConfigError names every such point with the change that
    would fit it. The checks passed, by memory_key: each run records the one it passed (its plan)
    and its summary measures itself against it. torch is imported only when a point is checked."""
    todo = limited(launcher, configs, labels)
    if not todo:
        return {}
    from hpctrain.analysis.memory import needed
    from hpctrain.memory.predict import check_fits
    from hpctrain.memory.trace import TraceError

    found: dict[Problem, list[str]] = {}
    passed: dict[str, MemoryBound] = {}
    for cfg, label, limit in todo:
        # a user's constructor or forward may be slow: said once, not a silent wait
        slow = threading.Timer(
            SLOW_TRACE_S,
            say,
            [f"memory: still tracing {label or 'the run'} after {SLOW_TRACE_S:g} s (the model is built and "
             f"stepped on fake tensors; Ctrl-C stops, {limit.key}=null runs unchecked)"],
        )  # fmt: skip
        slow.daemon = True
        slow.start()
        try:
            worst = check_fits(
                cfg, limit, launcher.on_gpus(cfg), lambda c: not problems(c, launcher.facts)
            ).worst
            passed[memory_key(cfg)] = MemoryBound(worst.reported, needed(worst), limit.bytes, limit.key)
        except ConfigError as e:
            for p in e.problems:
                found.setdefault(p, []).append(label)
        except TraceError as e:
            say(f"memory not predicted{' for ' + label if label else ''}: {e}")
        finally:
            slow.cancel()
    if found:
        raise by_point(found)
    return passed
