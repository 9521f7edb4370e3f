"""Config rules of sharded data parallelism (parallelism=fsdp | hsdp): the shard degree must fit
the world (fsdp: all of it; hsdp: a divisor leaving at least 2 replica groups),
reshard_after_forward must be what FSDP2 takes, and sharding settings given to another
parallelism are refused (they would do nothing). Pure: nothing is built."""

from __future__ import annotations

from hpctrain.config.layout import SHARDED, shard_degree
from hpctrain.config.schema import Config, DdpSettings, ShardSettings
from hpctrain.errors import Problem
from hpctrain.facts import HostFacts

SHARD_KEYS = ("degree", "reshard_after_forward", "modules", "cpu_offload")


def shard_problems(cfg: Config, world: int, facts: HostFacts | None = None) -> list[Problem]:
    """`facts`: the host the ranks run on, when known (local launches)."""
    par = cfg.parallelism
    if par.name not in SHARDED:
        return _unused(cfg)
    p = _degree_problems(cfg, world)
    p += _reshard_problems(cfg, world)
    p += _idle_settings(cfg)
    if par.shard.cpu_offload and not _on_gpus(cfg, facts):
        p.append(
            Problem(
                "parallelism.shard.cpu_offload",
                "offloading moves sharded state from GPU memory to host memory; this run trains on CPUs, "
                "where the state already is",
                "drop parallelism.shard.cpu_offload, or train on GPUs (train.device=cuda)",
            )
        )
    if cfg.script.path:
        p.append(
            Problem(
                "parallelism.name",
                f"parallelism={par.name} shards hpctrain's model; a script runs its own training",
                "use parallelism=data with script=..., or a model._target_ with the built-in trainer",
            )
        )
    return p


def _unused(cfg: Config) -> list[Problem]:
    given, default = cfg.parallelism.shard, ShardSettings()
    return [
        Problem(
            f"parallelism.shard.{k}",
            f"is a sharding setting; with parallelism={cfg.parallelism.name} it would do nothing",
            f"use parallelism=fsdp (or hsdp), or drop parallelism.shard.{k}",
        )
        for k in SHARD_KEYS
        if _plain(getattr(given, k)) != _plain(getattr(default, k))
    ]


def _plain(v: object) -> object:
    """A list (or OmegaConf's ListConfig) as a list of strings; scalars as they are."""
    return v if isinstance(v, (str, bool, int, float, type(None))) else [str(x) for x in v]  # type: ignore[attr-defined]


def _degree_problems(cfg: Config, world: int) -> list[Problem]:
    par, given = cfg.parallelism, cfg.parallelism.shard.degree
    if world < 1:
        return []  # the cluster checks report it
    node = max(int(cfg.cluster.node_size), 1)
    degree = shard_degree(cfg, world, node)
    if given is not None and not 1 <= given <= world:
        return [
            Problem("parallelism.shard.degree", f"must be in [1, {world}] (got {given})", _degree_fix(world))
        ]
    if world % degree:
        return [
            Problem(
                "parallelism.shard.degree",
                f"the world is replica groups x shard degree: {world} ranks are not a multiple of {degree}",
                _degree_fix(world),
            )
        ]
    if par.name == "fsdp" and degree != world:
        return [
            Problem(
                "parallelism.shard.degree",
                f"fsdp shards over the whole world of {world} ranks (got degree {degree})",
                f"use parallelism=hsdp for {world // degree} replica groups of {degree}, or drop "
                "parallelism.shard.degree",
            )
        ]
    if par.name == "hsdp" and world // degree < 2:
        why = "one node holds every rank" if given is None else f"degree {degree} leaves one group"
        return [
            Problem(
                "parallelism.shard.degree",
                f"hsdp replicates shard groups: it needs at least 2 groups ({why})",
                _degree_fix(world, hsdp=True) + ", or use parallelism=fsdp",
            )
        ]
    return []


def _degree_fix(world: int, hsdp: bool = False) -> str:
    divisors = [d for d in range(1, world + 1) if world % d == 0 and (not hsdp or d < world)]
    return f"set parallelism.shard.degree to one of {', '.join(map(str, divisors))}"


def _reshard_problems(cfg: Config, world: int) -> list[Problem]:
    r = cfg.parallelism.shard.reshard_after_forward
    if isinstance(r, bool):
        return []
    degree = shard_degree(cfg, world, max(int(cfg.cluster.node_size), 1))
    divisors = [d for d in range(2, degree) if degree % d == 0]
    fits = isinstance(r, int) and r in divisors
    if fits:
        return []
    ints = f", or one of {', '.join(map(str, divisors))}" if divisors else ""
    return [
        Problem(
            "parallelism.shard.reshard_after_forward",
            f"must be true, false, or a divisor of the shard degree {degree} other than 1 and "
            f"{degree} (FSDP2's rule; got {r!r})",
            f"set it to true (least memory) or false (no all-gather in backward){ints}",
        )
    ]


def _idle_settings(cfg: Config) -> list[Problem]:
    """Settings sharding ignores or cannot honour yet."""
    par, p = cfg.parallelism, []
    if cfg.precision.name == "fp16":
        p.append(
            Problem(
                "precision.name",
                f"fp16 needs a loss scale agreed across shards, which parallelism={par.name} does not make yet",
                "use precision=bf16 (parameters gathered in bf16, gradients reduced in fp32) or fp32",
            )
        )
    if par.compression != "none":
        p.append(
            Problem(
                "parallelism.compression",
                f"{par.name} reduce-scatters gradients in the precision policy's reduce dtype; "
                "a compression hook would do nothing",
                "drop parallelism.compression (precision=bf16 gathers parameters in bf16)",
            )
        )
    defaults = DdpSettings()
    for key in ("bucket_mb", "gradient_as_bucket_view", "static_graph"):
        if getattr(par, key) != getattr(defaults, key):
            p.append(
                Problem(
                    f"parallelism.{key}",
                    f"is a DistributedDataParallel setting; {par.name} groups gradients by shard unit",
                    f"drop parallelism.{key} (name the units in parallelism.shard.modules)",
                )
            )
    return p


def _on_gpus(cfg: Config, facts: HostFacts | None) -> bool:
    dev = cfg.train.device
    if dev != "auto":
        return dev == "cuda"
    if facts is not None:
        return facts.cuda_available
    return int(getattr(cfg.cluster, "gpus_per_node", 1)) > 0  # a cluster config that names no GPUs: CPUs
