"""The layout: which rank holds which part of the model, a degree per dimension of one mesh
(records/types.py's plans carry it; config/layout.py describes it)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Layout:
    """How the world's ranks hold the model, computed once at plan time (plan.json) and read by the
    ranks, like TorchTitan's ParallelDims: `stages` pipeline stages, each held by `replicate` x
    `shard` data-parallel ranks (replica groups x shards), each of those a group of `tp` tensor-
    parallel ranks. Rank order, outermost first: stage, replica group, shard, tensor rank; so a
    tensor-parallel group is consecutive ranks and stays on a node, then a shard group, and a
    pipeline's point-to-point traffic is what crosses nodes (Megatron-LM's order; Narayanan et al.
    2021, section 3.3). `virtual` model pieces per pipeline rank (interleaved schedules); zbv
    (`v_shape`) gives stage s pieces s and 2 x stages - 1 - s.

    `dims`: the named dimensions a dimension package adds (parallel/<name>/), between the shards
    and the tensor-parallel ranks in this order (TorchTitan's: pp, dp_replicate, dp_shard, cp,
    tp). The ranks along one of them read the same samples and hold the same parameters (context
    parallelism splits each sample's sequence among them), and their gradients are averaged with
    the stage's replicas' (replica_ranks)."""

    stages: int = 1
    replicate: int = 1
    shard: int = 1
    tp: int = 1
    virtual: int = 1
    v_shape: bool = False
    dims: dict[str, int] = field(default_factory=dict)

    def __hash__(self) -> int:  # a dict field: hashed by its items (the dataclass keeps this)
        return hash(
            (self.stages, self.replicate, self.shard, self.tp, self.virtual, self.v_shape, *self.dims.items())
        )

    @property
    def inner(self) -> int:
        """Ranks along the added dimensions together (1 without any)."""
        return math.prod(self.dims.values())

    @property
    def replicas(self) -> int:
        """Data-parallel ranks of one stage: each takes its own slice of the global batch."""
        return self.replicate * self.shard

    @property
    def world_size(self) -> int:
        return self.stages * self.replicas * self.inner * self.tp

    @property
    def pieces(self) -> int:
        """How many consecutive pieces the model is cut into."""
        return self.stages * self.virtual

    @property
    def pipelined(self) -> bool:
        return self.stages > 1

    def stage_of(self, rank: int) -> int:
        return rank // (self.replicas * self.inner * self.tp)

    def replica_of(self, rank: int) -> int:
        """Which slice of the global batch the rank reads (a tensor-parallel group reads one, and
        so do the ranks along the added dimensions)."""
        return (rank // (self.tp * self.inner)) % self.replicas

    def shard_of(self, rank: int) -> int:
        return (rank // (self.tp * self.inner)) % self.shard

    def group_of(self, rank: int) -> int:
        """The replica group (of shards) the rank belongs to."""
        return (rank // (self.tp * self.inner * self.shard)) % self.replicate

    def inner_of(self, rank: int) -> int:
        """The rank's position among the ranks along the added dimensions together."""
        return (rank // self.tp) % self.inner

    def dim_of(self, name: str, rank: int) -> int:
        """The rank's coordinate along the added dimension `name`."""
        names = list(self.dims)
        after = math.prod(self.dims[n] for n in names[names.index(name) + 1 :])
        return (rank // (self.tp * after)) % self.dims[name]

    def tp_of(self, rank: int) -> int:
        return rank % self.tp

    def pipeline_ranks(self, replica: int, tp_rank: int = 0, inner: int = 0) -> list[int]:
        """The ranks one pipeline of the given replica runs through, first stage first (each
        tensor-parallel rank of a replica, and each position along the added dimensions, has a
        pipeline of its own)."""
        return [
            ((s * self.replicas + replica) * self.inner + inner) * self.tp + tp_rank
            for s in range(self.stages)
        ]

    def pipeline_of(self, rank: int) -> list[int]:
        """The ranks of `rank`'s own pipeline."""
        return self.pipeline_ranks(self.replica_of(rank), self.tp_of(rank), self.inner_of(rank))

    def replica_ranks(self, stage: int) -> list[int]:
        """The ranks holding copies of one stage (tensor-parallel rank 0's): its gradients are
        averaged among them, the ranks along the added dimensions included."""
        return [(stage * self.replicas * self.inner + k) * self.tp for k in range(self.replicas * self.inner)]

    @property
    def mesh_dims(self) -> list[tuple[str, int]]:
        """The device mesh's dimensions in the rank order, outermost first; pipeline stages only
        where there are several (a dimension is a process group on every rank)."""
        dims = [("pp", self.stages)] if self.stages > 1 else []
        shards = [("replicate", self.replicate), ("shard", self.shard), *self.dims.items()]
        return [*dims, *shards, ("tp", self.tp)]

    def pieces_of(self, rank: int) -> list[int]:
        s = self.stage_of(rank)
        if self.v_shape:
            return [s, 2 * self.stages - 1 - s]
        return [k * self.stages + s for k in range(self.virtual)]
