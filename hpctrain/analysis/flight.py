"""What torch.distributed's flight recorder says of a hang: from every rank's dump (its
`_dump_fr_trace_json`: the last collectives each process group enqueued, their sequence numbers,
and per group the last one enqueued and completed), which collective each rank last entered and
which ranks never joined the one the others wait in. The stall watchdog (train/watchdog.py) has
the ranks dump when it fires and puts these lines in its report, beside the Python stacks.

A collective's sequence number counts the collectives of its process group on that rank, so in
a group every rank's number N is the same collective: a rank whose last is below the group's
highest never joined it, and the ranks at the highest wait for it (PyTorch's own analyser,
torch/distributed/flight_recorder, matches dumps the same way)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Entered:
    """The last collective one rank enqueued on one process group."""

    rank: int
    group: str  # the group's description (default_pg, or a mesh dimension's)
    seq: int  # its sequence number in the group (0: none enqueued)
    op: str  # e.g. gloo:all_reduce, nccl:_reduce_scatter_base
    completed: int  # the last sequence number the rank saw complete (-1: unknown)


def last_entered(rank: int, dump: Mapping[str, Any]) -> list[Entered]:
    """Per process group, the last collective this rank enqueued (point-to-point transfers have
    sequence numbers of their own, and are left out)."""
    names: dict[str, str] = {}
    ops: dict[tuple[str, int], str] = {}
    for e in dump.get("entries", []):
        if e.get("is_p2p"):
            continue
        pg = e.get("process_group") or ["?", "?"]
        names[str(e.get("pg_id", pg[0]))] = str(pg[1] or pg[0])
        ops[str(e.get("pg_id", pg[0])), int(e.get("collective_seq_id", 0))] = str(
            e.get("profiling_name", "?")
        )
    out = []
    for pg_id, status in sorted(dump.get("pg_status", {}).items()):
        seq = int(status.get("last_enqueued_collective", -1))
        if seq <= 0:
            continue
        done = int(status.get("last_completed_collective", -1))
        out.append(Entered(rank, names.get(pg_id, f"group {pg_id}"), seq, ops.get((pg_id, seq), "?"), done))
    return out


def hang_lines(dumps: Mapping[int, Mapping[str, Any]], world: int) -> list[str]:
    """One line per process group where the ranks disagree or a collective never completed: who
    entered which collective, who never joined it. Ranks without a dump are named once."""
    by_group: dict[str, list[Entered]] = {}
    for rank, dump in sorted(dumps.items()):
        for e in last_entered(rank, dump):
            by_group.setdefault(e.group, []).append(e)
    lines = []
    for group, entered in sorted(by_group.items()):
        lead = max(e.seq for e in entered)
        ahead = [e for e in entered if e.seq == lead]
        behind = [e for e in entered if e.seq < lead]
        if not behind and all(e.completed >= lead for e in ahead):
            continue  # nothing outstanding in this group
        said = f"{group}: rank(s) {_ranks(ahead)} entered {ahead[0].op} #{lead}"
        if behind:
            last = ", ".join(f"rank {e.rank} at #{e.seq} ({e.op})" for e in behind)
            lines.append(f"{said} and wait for it; never joined: {last}")
        else:
            lines.append(f"{said}; it never completed (every rank that dumped joined it)")
    missing = [r for r in range(world) if r not in dumps]
    if missing and dumps:
        lines.append(f"no flight record from rank(s) {_ranks_of(missing)} (stopped, or gone)")
    return lines


def _ranks(entered: list[Entered]) -> str:
    return _ranks_of([e.rank for e in entered])


def _ranks_of(ranks: list[int]) -> str:
    return ", ".join(str(r) for r in ranks)
