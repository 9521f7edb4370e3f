"""A pipeline step's point-to-point traffic, measured: every wait of the schedule on its sends and
receives is timed and split into the transfer (what the link takes for those bytes, from an α–β
fitted on this rank's own neighbours before training) and idle time (the rest of the wait: the
neighbour had not sent yet, the bubble proper). Together with the stages' compute, what remains
of the schedule's wall time is its own overhead (Python, autograd bookkeeping, posting the ops).

torch.distributed.pipelining's schedules post and wait through two module functions,
`_batch_p2p` and `_wait_batch_p2p`; they are wrapped once per process (a pipeline rank runs one
schedule). tests/mpi/test_pipeline.py fails if a torch release renames them.
"""

from __future__ import annotations

import functools
import statistics
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from hpctrain.engine.clock import Clock, Mark
from hpctrain.errors import HpctrainError

# ping-pong sizes for the link's α–β: one value, and 1 MiB (activations are KiB to MiB)
PROBE_BYTES = (4, 1 << 20)
PROBE_REPEATS = 7


class P2PError(HpctrainError):
    """torch.distributed.pipelining no longer has the functions its waits are timed through."""


@dataclass(frozen=True)
class Link:
    """One-way time of a message of b bytes between neighbouring stages: alpha + beta * b
    (Hockney's model)."""

    alpha_s: float = 0.0
    beta_s_per_byte: float = 0.0

    def time_s(self, nbytes: int) -> float:
        return self.alpha_s + self.beta_s_per_byte * nbytes


@dataclass
class Traffic:
    """This rank's waits on point-to-point transfers within the current step."""

    idle_s: float = 0.0  # waiting for a neighbour beyond what the transfer takes: the bubble
    transfer_s: float = 0.0  # waiting for the bytes to move
    bytes: int = 0  # sent + received
    messages: int = 0

    def reset(self) -> None:
        self.idle_s = self.transfer_s = 0.0
        self.bytes = self.messages = 0

    @property
    def wait_s(self) -> float:
        return self.idle_s + self.transfer_s


def _nbytes(op: Any) -> int:
    t = op.tensor
    return int(t.numel() * t.element_size())


class Meter:
    """Times the schedule's waits into a Traffic. Holds the posted batches until they are waited
    on (keyed by the list object the schedule passes back), and the waits (the clock's marks
    around them) until the step has settled."""

    def __init__(self, link: Link) -> None:
        self.link = link
        self.traffic = Traffic()
        self._posted: dict[int, tuple[list[Any], int, int]] = {}
        self._waits: list[tuple[Mark, Mark, int, int]] = []

    def posted(self, ops: list[Any], works: list[Any]) -> list[Any]:
        sent = sum(_nbytes(op) for op in ops if op.op is dist.isend)
        received = sum(_nbytes(op) for op in ops if op.op is not dist.isend)
        self._posted[id(works)] = (works, sent, received)
        return works

    def waited(self, works: list[Any], start: Mark, end: Mark) -> None:
        _, sent, received = self._posted.pop(id(works), (works, 0, 0))
        if sent or received:
            self._waits.append((start, end, sent, received))

    def settle(self, clock: Clock) -> Traffic:
        """The step's waits, read (the step has settled) and split into transfers and idle time."""
        for start, end, sent, received in self._waits:
            seconds = clock.seconds(start, end)
            # sends and receives of one batch move in opposite directions at once
            moving = min(seconds, self.link.time_s(max(sent, received)))
            self.traffic.transfer_s += moving
            self.traffic.idle_s += seconds - moving
            self.traffic.bytes += sent + received
            self.traffic.messages += 1
        self._waits.clear()
        return self.traffic

    def reset(self) -> None:
        self.traffic.reset()
        self._posted.clear()
        self._waits.clear()


def install(meter: Meter, clock: Clock) -> None:
    """Route the pipelining schedules' posts and waits through `meter` (once per process). A wait
    is the span between the clock's marks around it: under NCCL, work.wait() makes the compute
    stream wait, so the span is the device's stall, not the host's return."""
    from torch.distributed.pipelining import schedules

    post = getattr(schedules, "_batch_p2p", None)
    wait = getattr(schedules, "_wait_batch_p2p", None)
    if post is None or wait is None:
        raise P2PError(
            "torch.distributed.pipelining.schedules has no _batch_p2p/_wait_batch_p2p in torch "
            f"{torch.__version__}: the pipeline's transfer and idle times cannot be measured"
        )
    post = getattr(post, "__wrapped__", post)  # installed before: wrap torch's own again
    wait = getattr(wait, "__wrapped__", wait)

    @functools.wraps(post)
    def batch_p2p(p2p_ops: list[Any], desc: str | None = None) -> list[Any]:
        return meter.posted(p2p_ops, post(p2p_ops, desc=desc))

    @functools.wraps(wait)
    def wait_batch_p2p(work: list[Any]) -> None:
        start = clock.mark()
        wait(work)
        meter.waited(work, start, clock.mark())

    schedules._batch_p2p = batch_p2p
    schedules._wait_batch_p2p = wait_batch_p2p


def _round_trip(peer: int, first: bool, buf: torch.Tensor, group: Any, clock: Clock) -> float:
    start = clock.mark()
    if first:
        dist.send(buf, dst=peer, group=group)
        dist.recv(buf, src=peer, group=group)
    else:
        dist.recv(buf, src=peer, group=group)
        dist.send(buf, dst=peer, group=group)
    end = clock.mark()
    clock.settle(end)
    return clock.seconds(start, end)


def measure_link(ranks: list[int], rank: int, group: Any, device: torch.device, clock: Clock) -> Link:
    """α–β of this pipeline's links from ping-pongs between neighbouring stages, one pair after
    the other (every rank of the pipeline calls it). A rank fits the links it is part of; the
    one-way time is half the median round trip."""
    times: dict[int, list[float]] = {b: [] for b in PROBE_BYTES}
    for a, b in zip(ranks, ranks[1:]):
        if rank not in (a, b):
            continue
        peer = b if rank == a else a
        for size in PROBE_BYTES:
            buf = torch.zeros(max(1, size // 4), dtype=torch.float32, device=device)
            rounds = [_round_trip(peer, rank == a, buf, group, clock) for _ in range(PROBE_REPEATS + 1)]
            times[size].append(statistics.median(rounds[1:]) / 2)  # the first warms the pair up
    if not times[PROBE_BYTES[0]]:
        return Link()
    small, large = (statistics.fmean(times[b]) for b in PROBE_BYTES)
    beta = max(0.0, (large - small) / (PROBE_BYTES[1] - PROBE_BYTES[0]))
    return Link(alpha_s=max(0.0, small - beta * PROBE_BYTES[0]), beta_s_per_byte=beta)
