"""Which rank holds which piece of the model: pure arithmetic, shared by the plan (and --dry-run),
the validation and the ranks themselves.

The world is `stages` x `replicas` ranks. Rank r holds pipeline stage r // replicas as replica
r % replicas, so the replicas of a stage are consecutive ranks: with ranks placed on nodes in
blocks (mpirun's and srun's default) they share a node, and the gradient allreduce, which moves
the whole stage's gradients every step, stays inside it; the pipeline's point-to-point traffic
(one activation per micro-batch) is what crosses nodes. This is Megatron-LM's order (data
parallelism inside pipeline parallelism; Narayanan et al. 2021, section 3.3).

Interleaved schedules give each pipeline rank `virtual` model pieces: piece k*stages + s lives on
stage s (torch.distributed.pipelining's looped placement); zbv gives each two, in a V: stage s
holds pieces s and 2*stages - 1 - s, so the first and last pieces share rank 0.

Sharded data parallelism (fsdp, hsdp) is one stage whose ranks each hold a shard: the mesh is
replicate x shard, rank r holding shard r % degree of replica group r // degree, so a shard group
is consecutive ranks and stays inside a node when the degree divides the ranks per node (HSDP's
usual layout: the all-gathers and reduce-scatters of every block stay on the node, and only the
replicas' gradient all-reduce crosses nodes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hpctrain.config.schema import Config


PIPELINED = ("pipeline", "hybrid")  # the model cut into stages across ranks
SHARDED = ("fsdp", "hsdp")  # one stage, its parameters sharded across ranks


@dataclass(frozen=True)
class ScheduleKind:
    """What a pipeline schedule needs: torch.distributed.pipelining's class, model pieces per rank
    ("one", "virtual" = parallelism.virtual_stages, or "two" in a V), whether it splits the
    backward into input and weight gradients (zero bubble), and the least virtual_stages."""

    torch_class: str
    pieces: str = "one"
    split_backward: bool = False
    min_virtual: int = 1

    @property
    def multi(self) -> bool:
        """Runs several stages per rank (a runtime schedule: takes a list of stages)."""
        return self.pieces != "one" or self.split_backward


SCHEDULES = {
    "gpipe": ScheduleKind("ScheduleGPipe"),
    "1f1b": ScheduleKind("Schedule1F1B"),
    "interleaved_1f1b": ScheduleKind("ScheduleInterleaved1F1B", "virtual", min_virtual=2),
    "interleaved_zb": ScheduleKind("ScheduleInterleavedZeroBubble", "virtual", split_backward=True),
    "zbv": ScheduleKind("ScheduleZBVZeroBubble", "two", split_backward=True),
}


@dataclass(frozen=True)
class Layout:
    stages: int  # pipeline depth: ranks one sample's forward pass goes through
    replicas: int  # data-parallel copies of every stage
    virtual: int = 1  # model pieces per pipeline rank (interleaved schedules, zbv)
    v_shape: bool = False  # zbv: stage s holds pieces s and 2*stages - 1 - s

    @property
    def world_size(self) -> int:
        return self.stages * self.replicas

    @property
    def pieces(self) -> int:
        """How many consecutive pieces the model is cut into."""
        return self.stages * self.virtual

    def stage_of(self, rank: int) -> int:
        return rank // self.replicas

    def replica_of(self, rank: int) -> int:
        return rank % self.replicas

    def pipeline_ranks(self, replica: int) -> list[int]:
        """The ranks one pipeline of the given replica runs through, first stage first."""
        return [s * self.replicas + replica for s in range(self.stages)]

    def replica_ranks(self, stage: int) -> list[int]:
        """The ranks holding copies of one stage: its gradients are averaged among them."""
        return [stage * self.replicas + r for r in range(self.replicas)]

    def pieces_of(self, rank: int) -> list[int]:
        s = self.stage_of(rank)
        if self.v_shape:
            return [s, 2 * self.stages - 1 - s]
        return [k * self.stages + s for k in range(self.virtual)]

    @property
    def pipelined(self) -> bool:
        return self.stages > 1


@dataclass(frozen=True)
class Placement:
    rank: int
    node: int
    stage: int
    replica: int
    pieces: tuple[int, ...]


def placements(layout: Layout, ranks_per_node: int) -> list[Placement]:
    """Every rank's node (block placement: ranks 0..k-1 on the first node), stage and replica."""
    return [
        Placement(
            r, r // ranks_per_node, layout.stage_of(r), layout.replica_of(r), tuple(layout.pieces_of(r))
        )
        for r in range(layout.world_size)
    ]


def describe(layout: Layout, ranks_per_node: int) -> list[str]:
    """The plan's lines: per node, which ranks hold which stage."""
    lines = []
    by_node: dict[int, list[Placement]] = {}
    for p in placements(layout, ranks_per_node):
        by_node.setdefault(p.node, []).append(p)
    for node, ps in sorted(by_node.items()):
        held = ", ".join(
            f"rank {p.rank}: stage {p.stage}"
            + (f" (pieces {', '.join(map(str, p.pieces))})" if layout.virtual > 1 else "")
            + (f" replica {p.replica}" if layout.replicas > 1 else "")
            for p in ps
        )
        lines.append(f"node {node}: {held}")
    return lines


def layout_for(cfg: Config, world: int) -> Layout:
    """Data parallelism is the one-stage case: every rank a replica of the whole model."""
    par = cfg.parallelism
    if par.name not in PIPELINED:
        return Layout(1, world)
    stages = max(par.stages, 1)
    kind = SCHEDULES[str(par.schedule)]
    virtual = {"one": 1, "two": 2}.get(kind.pieces, max(par.virtual_stages, 1))
    return Layout(stages, max(world // stages, 1), virtual, v_shape=kind.pieces == "two")


@dataclass(frozen=True)
class ShardMesh:
    """FSDP2's device mesh: `replicate` groups of `shard` ranks (fsdp: one group)."""

    replicate: int
    shard: int

    def shard_of(self, rank: int) -> int:
        return rank % self.shard

    def group_of(self, rank: int) -> int:
        return rank // self.shard


def shard_degree(cfg: Config, world: int, ranks_per_node: int) -> int:
    """parallelism.shard.degree as given; null: the world (fsdp) or one node's ranks (hsdp)."""
    given = cfg.parallelism.shard.degree
    if given is not None:
        return int(given)
    return world if cfg.parallelism.name == "fsdp" else min(ranks_per_node, world)


def shard_mesh(cfg: Config, world: int, ranks_per_node: int) -> ShardMesh:
    degree = max(shard_degree(cfg, world, ranks_per_node), 1)
    return ShardMesh(max(world // degree, 1), degree)


def describe_mesh(mesh: ShardMesh, world: int, ranks_per_node: int) -> list[str]:
    """The plan's lines: per node, which rank holds which shard of which replica group."""
    lines = []
    for node in range((world + ranks_per_node - 1) // ranks_per_node):
        ranks = range(node * ranks_per_node, min((node + 1) * ranks_per_node, world))
        held = ", ".join(
            f"rank {r}: shard {mesh.shard_of(r)}/{mesh.shard}"
            + (f" of group {mesh.group_of(r)}" if mesh.replicate > 1 else "")
            for r in ranks
        )
        lines.append(f"node {node}: {held}")
    return lines
