"""Reading a hang from the ranks' flight recorder dumps (analysis/flight.py), in torch's
`_dump_fr_trace_json` format (as a 2-rank Gloo run wrote it)."""

from __future__ import annotations

from typing import Any

from hpctrain.analysis.flight import hang_lines, last_entered


def _entry(pg: int, desc: str, seq: int, op: str, p2p: bool = False) -> dict[str, Any]:
    return {
        "collective_seq_id": 0 if p2p else seq,
        "p2p_seq_id": seq if p2p else 0,
        "is_p2p": p2p,
        "pg_id": pg,
        "process_group": [str(pg), desc],
        "profiling_name": op,
        "state": "scheduled",
    }


def _dump(entries: list[dict[str, Any]], status: dict[str, tuple[int, int]]) -> dict[str, Any]:
    return {
        "version": "2.10",
        "entries": entries,
        "pg_status": {
            pg: {
                "last_enqueued_collective": str(q),
                "last_completed_collective": str(c),
                "last_started_collective": "-1",
            }
            for pg, (q, c) in status.items()
        },
    }


# rank 0 entered the default group's all-reduce #5 (after a shard group's #12) and waits; rank 1
# is still in its forward pass: its last is #4 there and #11 in the shard group
RANK0 = _dump(
    [
        _entry(0, "default_pg", 4, "gloo:all_reduce"),
        _entry(0, "default_pg", 5, "gloo:all_reduce"),
        _entry(1, "mesh_shard", 12, "gloo:_reduce_scatter_base"),
        _entry(0, "default_pg", 3, "gloo:send", p2p=True),
    ],
    {"0": (5, 4), "1": (12, 12)},
)
RANK1 = _dump(
    [_entry(0, "default_pg", 4, "gloo:all_reduce"), _entry(1, "mesh_shard", 11, "gloo:_allgather_base")],
    {"0": (4, 4), "1": (11, 11)},
)


def test_each_rank_s_last_collective_per_group() -> None:
    [default, shard] = last_entered(0, RANK0)
    assert (default.group, default.seq, default.op, default.completed) == (
        "default_pg",
        5,
        "gloo:all_reduce",
        4,
    )
    assert (shard.group, shard.seq, shard.op) == ("mesh_shard", 12, "gloo:_reduce_scatter_base")
    assert last_entered(0, {"entries": [], "pg_status": {"0": {"last_enqueued_collective": "-1"}}}) == []


def test_the_ranks_that_never_joined_are_named_with_where_they_are() -> None:
    assert hang_lines({0: RANK0, 1: RANK1}, 2) == [
        "default_pg: rank(s) 0 entered gloo:all_reduce #5 and wait for it; never joined: rank 1 at #4 (gloo:all_reduce)",
        "mesh_shard: rank(s) 0 entered gloo:_reduce_scatter_base #12 and wait for it; never joined: rank 1 at #11 "
        "(gloo:_allgather_base)",
    ]


def test_a_collective_every_rank_joined_that_never_completed_and_a_missing_dump() -> None:
    joined = _dump([_entry(0, "default_pg", 5, "gloo:all_reduce")], {"0": (5, 4)})
    assert hang_lines({0: joined, 1: joined}, 3) == [
        "default_pg: rank(s) 0, 1 entered gloo:all_reduce #5; it never completed (every rank that dumped joined it)",
        "no flight record from rank(s) 2 (stopped, or gone)",
    ]
    done = _dump([_entry(0, "default_pg", 5, "gloo:all_reduce")], {"0": (5, 5)})
    assert hang_lines({0: done, 1: done}, 2) == []  # nothing outstanding: nothing to say
