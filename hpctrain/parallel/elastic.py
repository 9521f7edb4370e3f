"""Elastic restarts (train.elastic): a run that lost a node goes on with the nodes left, as
Elastic Horovod goes on with fewer hosts, instead of waiting in the queue for the full size. The
smaller run is planned as a submission is: its config at the node count left must pass the
parallelism's rules (a shard or tensor-parallel degree still divides the world, the replicas still
divide the batch), and its world size, batch, learning rate and layout are derived again.

What changes with the world size is a setting, train.elastic_keeps:
- global_batch (the default): the global batch stays and each replica takes a larger slice of it;
  the learning rate is unchanged and every step sees the same samples as before, so the run goes
  on as the uninterrupted one would (to the reductions' rounding).
- batch_per_rank: each replica keeps its batch, the global batch shrinks with the world, and
  optim.lr_scaling sets the learning rate for it (linear: Goyal et al. 2017).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from hpctrain.config.derived import Derived, world_size
from hpctrain.config.options import ElasticKeeps
from hpctrain.config.schema import Config
from hpctrain.errors import Problem
from hpctrain.parallel.registry import derive, kind_of, resolve_batch
from hpctrain.parallel.rules import parallelism_problems


def min_ranks(cfg: Config) -> int:
    """The fewest ranks an elastic restart goes on with (default: one node's)."""
    return cfg.train.min_ranks or max(int(cfg.cluster.node_size), 1)


def elastic_problems(cfg: Config) -> list[Problem]:
    """The rules of train.elastic, min_ranks and elastic_keeps at submission."""
    t = cfg.train
    if not t.elastic:
        return [
            Problem(key, "only acts with train.elastic=true", f"set train.elastic=true, or drop {key}")
            for key, given in (
                ("train.min_ranks", t.min_ranks is not None),
                ("train.elastic_keeps", t.elastic_keeps != ElasticKeeps.global_batch),
            )
            if given
        ]
    p = []
    if t.max_restarts < 1:
        p.append(
            Problem(
                "train.elastic",
                "goes on with fewer nodes after a restart, and train.max_restarts=0 allows none",
                "set train.max_restarts=1 or more",
            )
        )
    if not type(cfg.cluster).loses_nodes:
        p.append(
            Problem(
                "train.elastic",
                f"a {cfg.cluster.name} run has no nodes to lose (a restart starts the same ranks again)",
                "drop train.elastic, or run on cluster=slurm",
            )
        )
    if cfg.script.path:
        p.append(
            Problem(
                "train.elastic",
                "a script sizes its own batch and world; hpctrain cannot plan it again on fewer nodes",
                "drop train.elastic (train.max_restarts restarts a script at its full size)",
            )
        )
    world = world_size(cfg)
    if t.min_ranks is not None and not 1 <= t.min_ranks <= world:
        p.append(
            Problem(
                "train.min_ranks",
                f"must be between 1 and the run's {world} ranks (got {t.min_ranks})",
                f"e.g. train.min_ranks={max(world // 2, 1)}",
            )
        )
    return p


def shrunk(cfg: Config, nodes: int) -> Config:
    """The run's config on `nodes` nodes, keeping what train.elastic_keeps says."""
    cluster = dataclasses.replace(cfg.cluster, **{cfg.cluster.study_scale: nodes})
    train, optim = cfg.train, cfg.optim
    if train.elastic_keeps == ElasticKeeps.global_batch:
        batch = resolve_batch(cfg)
        train = dataclasses.replace(train, global_batch=batch.global_, batch_per_rank=None)
        # the same learning rate: a scaling rule's reference stays the batch it was at
        optim = dataclasses.replace(optim, reference_batch=optim.reference_batch or batch.per_rank)
    return dataclasses.replace(cfg, cluster=cluster, train=train, optim=optim)


@dataclass(frozen=True)
class Resize:
    """An elastic restart's plan: the run on fewer nodes, or why it cannot go on there."""

    nodes: int
    derived: Derived | None  # None: it cannot (problems say why)
    notes: list[str]
    problems: list[Problem]

    def describe(self, world: int, global_batch: int, lr: float) -> str:
        """How the run changes from `world` ranks, `global_batch` and `lr`, or why it cannot."""
        if self.derived is None:
            return "; ".join(f"{p.key}: {p.rule}" for p in self.problems)
        d = self.derived
        return (
            f"went on with {world} -> {d.world_size} ranks on {self.nodes} node(s), global batch "
            f"{global_batch} -> {d.batch.global_} ({d.batch.per_rank} per replica), lr {lr:g} -> {d.lr:g}"
        )


def resize(cfg: Config, nodes: int) -> Resize:
    """The plan of `cfg`'s run on `nodes` nodes (the nodes left after a loss)."""
    small = shrunk(cfg, nodes)
    world, least = world_size(small), min_ranks(cfg)
    p = []
    if nodes < 1 or world < least:
        p.append(
            Problem(
                "train.min_ranks",
                f"{world} rank(s) are left, fewer than {least}",
                "the run waits in the queue for its full size",
            )
        )
    else:
        p += parallelism_problems(small, world)
    if p:
        return Resize(nodes, None, [], p)
    d = derive(small)
    return Resize(nodes, d, kind_of(small).notes(small, d.layout, int(small.cluster.node_size)), [])
