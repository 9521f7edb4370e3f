"""The communication roofline of a run: its gradient bytes, grouped as its engine groups them,
placed on the measured allreduce curve: the time the collectives should take, what the step
actually waited for (split into the transfer and the wait for the slowest rank to arrive, which
no communication setting shortens), how much was hidden behind the backward pass, and what
bounds it.

Latency-bound: the per-collective costs (engine coordination L plus 2(n-1) alpha per message)
exceed the bytes' time on the wire, 2(n-1)/n m beta (Hockney's model, see model.py): fewer,
larger collectives help. Bandwidth-bound: the other way round: fewer bytes (compression) help.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hpctrain.analysis.model import CommModel, from_probe
from hpctrain.records import RunSummary, wire_bytes_per_param
from hpctrain.records.parts import split_degree

MIB = 2**20
WAIT_FACTOR = 1.5  # exposed beyond this multiple of the expected time is waiting, not transfer
# buckets (torch DDP): the first gradients go in a small bucket (DDP's _DEFAULT_FIRST_BUCKET_BYTES)
FIRST_BUCKET_BYTES = 1 * MIB
# the setting that makes the groups larger, by grouping (the engines' own keys)
GROUP_KNOB = {"buckets": "parallelism.bucket_mb", "fusion": "parallelism.fusion_threshold_mb"}
# FSDP ("shards"): per unit, an all-gather in forward, another in backward (resharded after
# forward) and a reduce-scatter, each (n-1)/n of the unit's bytes and n-1 ring steps: 3 (n-1)/n m
# on the wire against an all-reduce's 2 (n-1)/n m (Rajbhandari et al. 2020, section 7: 1.5x DP's
# volume), so its roofline is the all-reduce's alpha-beta model times 1.5
VOLUME = {"shards": 1.5}


def messages(grouping: str, grad_bytes: float, bucket_bytes: float, tensors: int) -> int:
    """Collectives per step, by how the engine groups gradients (its record says): "fusion" fills
    a buffer up to its size per message (0 disables fusion: one per tensor); "buckets" sends a
    1 MiB first bucket, then buckets of the bucket size."""
    if grad_bytes <= 0:
        return 0
    if grouping == "shards":  # one all-gather / reduce-scatter group per FSDP unit
        return max(tensors, 1)
    if bucket_bytes <= 0:
        return max(tensors, 1)
    if grouping == "buckets":
        first = min(FIRST_BUCKET_BYTES, bucket_bytes)
        return 1 + math.ceil(max(grad_bytes - first, 0) / bucket_bytes)
    return math.ceil(grad_bytes / bucket_bytes)


def describe_grouping(engine: str, grouping: str, bucket_bytes: float) -> str:
    if grouping == "shards":
        return "FSDP units (all-gathers and a reduce-scatter each: 1.5x an all-reduce)"
    if grouping == "buckets":
        return f"{engine} buckets of {bucket_bytes / MIB:g} MiB"
    if bucket_bytes <= 0:
        return f"{engine} without fusion (one message per tensor)"
    return f"{engine} fusion buffer of {bucket_bytes / MIB:g} MiB"


@dataclass(frozen=True)
class Roofline:
    engine: str
    group_kind: str  # fusion | buckets
    n: int
    grad_bytes: float
    messages: int
    grouping: str
    latency_s: float  # expected per-collective costs
    bandwidth_s: float  # expected time of the bytes on the wire
    exposed_s: float  # measured: what the step waited for the collectives (less the wait below)
    compression: str
    wait_s: float = 0.0  # measured: waiting for the slowest rank to arrive (load imbalance)

    @property
    def expected_s(self) -> float:
        return self.latency_s + self.bandwidth_s

    @property
    def overlap(self) -> float:
        """Share of the expected communication hidden behind compute (1 - exposed / expected);
        negative when the step waited longer than the collectives should take."""
        return 1 - self.exposed_s / self.expected_s if self.expected_s > 0 else math.nan

    @property
    def waits(self) -> bool:
        """The step waited far longer than the transfer takes: for a slower rank or for a core
        (stragglers, oversubscription), which no communication setting fixes."""
        return self.exposed_s > WAIT_FACTOR * self.expected_s

    @property
    def imbalanced(self) -> bool:
        """Waiting for the slowest rank costs the step more than the collectives should."""
        return self.wait_s > self.expected_s

    @property
    def bound(self) -> str:
        return "latency" if self.latency_s > self.bandwidth_s else "bandwidth"

    @property
    def knob(self) -> str:
        if self.imbalanced:
            return (
                f"the ranks wait {1e3 * self.wait_s:.2f} ms per step for the slowest one (load imbalance), "
                "more than the collectives take: even out the work per rank (data loading, a slower "
                "node, ranks sharing cores) before tuning communication"
            )
        if self.waits:
            return (
                "the step waits for something other than the transfer: look for a slower rank or "
                "ranks sharing cores before tuning communication"
            )
        if self.group_kind == "shards":
            if self.bound == "bandwidth":
                return (
                    "parallelism.shard.reshard_after_forward=false skips the all-gather in backward "
                    "(1.5x -> 1x an all-reduce's bytes) for the memory of the gathered units"
                )
            return (
                f"shard coarser units (parallelism.shard.modules; {self.messages} now) for fewer collectives"
            )
        if self.bound == "bandwidth":
            if self.compression == "none":
                return "parallelism.compression=fp16 halves the bytes on the wire"
            return "the gradients are compressed already: a larger batch per rank hides more of the transfer"
        knob = GROUP_KNOB.get(self.group_kind, GROUP_KNOB["fusion"])
        if self.group_kind == "buckets":
            if self.messages > 1:
                return f"raise {knob} for fewer buckets ({self.messages} now)"
            return "one bucket already: a larger batch per rank amortises the latency"
        if self.messages > 1:
            return f"raise {knob} for fewer messages ({self.messages} now)"
        return "one fused message already: lower parallelism.cycle_time_ms to shorten Horovod's cycle"

    def line(self) -> str:
        overlap = (
            f"nothing hidden: {self.exposed_s / self.expected_s:.2f}x the expected time"
            if self.expected_s > 0 and self.exposed_s > self.expected_s
            else f"{100 * self.overlap:.0f}% overlapped"
            if math.isfinite(self.overlap)
            else "overlap unknown"
        )
        return (
            f"{self.grad_bytes / MIB:.2f} MiB of gradients in {self.messages} message(s) ({self.grouping}): "
            f"expected {1e3 * self.expected_s:.2f} ms (latency {1e3 * self.latency_s:.2f} + bandwidth "
            f"{1e3 * self.bandwidth_s:.2f}), exposed {1e3 * self.exposed_s:.2f} ms, {overlap}"
            + (f", plus {1e3 * self.wait_s:.2f} ms waiting for the slowest rank" if self.wait_s > 0 else "")
            + f"; {self.bound}-bound: {self.knob}"
        )


def roofline(
    engine: str,
    group_kind: str,
    n: int,
    grad_bytes: float,
    bucket_bytes: float,
    tensors: int,
    comm: CommModel,
    exposed_s: float,
    compression: str = "none",
    wait_s: float = 0.0,
) -> Roofline | None:
    """None for a single rank (nothing to reduce) or no gradients."""
    if n <= 1 or grad_bytes <= 0:
        return None
    k = messages(group_kind, grad_bytes, bucket_bytes, tensors)
    volume = VOLUME.get(group_kind, 1.0)
    return Roofline(
        engine,
        group_kind,
        n,
        grad_bytes,
        k,
        describe_grouping(engine, group_kind, bucket_bytes),
        volume * comm.latency_part(n, k),
        volume * comm.bandwidth_part(n, grad_bytes),
        exposed_s,
        compression,
        wait_s,
    )


def for_run(
    s: RunSummary, bucket_bytes: float | None = None, compression: str | None = None
) -> Roofline | None:
    """A run's roofline on its own probe (None: a single rank, a pipeline, one tensor-parallel
    replica, or an older record). The gradients' collectives span the data-parallel ranks and
    carry a tensor-parallel rank's slice: world / tp ranks, grad_bytes / tp each. With
    `bucket_bytes` or `compression`: the same run had it grouped or compressed its gradients so
    (hpctrain tune's predictions); the probe, of the bytes the run sent, stays its own."""
    comm = from_probe(s.world_size, s.grad_bytes, s.probe_small_s, s.probe_full_s)
    if comm is None or not math.isfinite(s.comm_s):
        return None
    wait = s.imbalance_s if math.isfinite(s.imbalance_s) else 0.0
    tp = split_degree(s)  # each layer's ranks (tensor parallelism's) send a slice each
    compression = s.compression if compression is None else compression
    return roofline(
        s.engine,
        s.grouping,
        s.world_size // tp,
        s.parameters * wire_bytes_per_param(compression) / tp,
        s.grad_bucket_bytes if bucket_bytes is None else bucket_bytes,
        s.grad_tensors,
        comm,
        max(s.comm_s - wait, 0.0),
        compression,
        wait,
    )
