"""Config rules of sharded data parallelism (parallelism=fsdp | hsdp): the shard degree must fit
the world (fsdp: all of it; hsdp: a divisor leaving at least 2 replica groups) and
reshard_after_forward must be what FSDP2 takes. Pure: nothing is built."""

from __future__ import annotations

from hpctrain.config.schema import Config, DdpSettings
from hpctrain.errors import Problem
from hpctrain.facts import HostFacts


def shard_problems(
    cfg: Config, world: int, degree: int, whole_world: bool, facts: HostFacts | None
) -> list[Problem]:
    """`degree`: the shard degree the layout takes; `whole_world`: fsdp (one shard group), not
    hsdp (at least two); `facts`: the host the ranks run on, when known (local launches)."""
    par = cfg.parallelism
    p = _degree_problems(cfg, world, degree, whole_world)
    p += _reshard_problems(cfg, degree)
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
    return p


def _degree_problems(cfg: Config, world: int, degree: int, whole_world: bool) -> list[Problem]:
    given = cfg.parallelism.shard.degree
    if world < 1:
        return []  # the cluster checks report it
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
    if whole_world and degree != world:
        return [
            Problem(
                "parallelism.shard.degree",
                f"fsdp shards over the whole world of {world} ranks (got degree {degree})",
                f"use parallelism=hsdp for {world // degree} replica groups of {degree}, or drop "
                "parallelism.shard.degree",
            )
        ]
    if not whole_world and world // degree < 2:
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


def _reshard_problems(cfg: Config, degree: int) -> list[Problem]:
    r = cfg.parallelism.shard.reshard_after_forward
    if isinstance(r, bool):
        return []
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
