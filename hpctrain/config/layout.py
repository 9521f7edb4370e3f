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

from hpctrain.records import Layout
from hpctrain.records.schedules import SCHEDULES, ScheduleKind

__all__ = ["SCHEDULES", "Layout", "ScheduleKind", "describe", "describe_mesh", "placements"]


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


def describe_mesh(layout: Layout, ranks_per_node: int) -> list[str]:
    """The plan's lines: per node, which rank holds which shard (and position along the named
    dimensions, and tensor-parallel slice) of which replica group."""
    lines, world = [], layout.world_size
    for node in range((world + ranks_per_node - 1) // ranks_per_node):
        ranks = range(node * ranks_per_node, min((node + 1) * ranks_per_node, world))
        lines.append(f"node {node}: " + ", ".join(f"rank {r}: {_held(layout, r)}" for r in ranks))
    return lines


def _held(layout: Layout, r: int) -> str:
    parts = [f"tp {layout.tp_of(r)}/{layout.tp}"] if layout.tp > 1 else []
    parts += [
        f"{name} {layout.dim_of(name, r)}/{n}" for name, n in reversed(layout.dims.items())
    ]  # innermost first
    if layout.shard > 1 or not parts:
        parts.append(f"shard {layout.shard_of(r)}/{layout.shard}")
    group = f" of group {layout.group_of(r)}" if layout.replicate > 1 else ""
    stage = f"stage {layout.stage_of(r)}: " if layout.pipelined else ""
    return stage + " of ".join(parts) + group
