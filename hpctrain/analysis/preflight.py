"""Pre-flight verdicts (cluster.preflight): each node judged against the job's own median, and
against a reference where one is given, ReFrame-style: a measured value, the reference it is
held to and the tolerance, all in the verdict.

Every rank times a GEMM at the run's precision (its compute) and a ring exchange with the next
rank (its link: alpha from a one-byte message, beta from a large one, the same fit the
allreduce probe uses). A node is as fast as its slowest rank, and its link is the slowest of
its ranks' links that leave the node (links within a node are not the network). A node is bad
when its compute falls below (1 - tolerance) x the nodes' median or below `min_tflops`, or
when every link it has to other nodes falls below (1 - tolerance) x the median inter-node
link or below `min_link_gbps`: one slow link names neither end, a node whose links are all slow
is the one to blame (with two nodes, their one pair of links condemns both)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass


@dataclass(frozen=True)
class Probe:
    """One rank's measurements."""

    rank: int
    host: str
    tflops: float
    peer_host: str  # the next rank's host (the ring's link goes there)
    link_alpha_s: float = 0.0  # one byte each way (0: not measured)
    link_gbps: float = 0.0  # large messages each way, in GB/s (0: not measured)


@dataclass(frozen=True)
class Verdict:
    host: str
    bad: bool
    tflops: float  # the node's slowest rank
    tflops_reference: float  # what it was held to: (1 - tolerance) x median, or min_tflops
    link_gbps: float  # its slowest link to another node (0: none measured)
    link_reference: float
    why: str  # "" when good

    def line(self) -> str:
        state = f"BAD: {self.why}" if self.bad else "good"
        link = (
            f", link {self.link_gbps:.2f} GB/s (held to {self.link_reference:.2f})" if self.link_gbps else ""
        )
        return f"{self.host}: {self.tflops:.3g} TFLOP/s (held to {self.tflops_reference:.3g}){link}: {state}"


def judge(
    probes: list[Probe], tolerance: float, min_tflops: float | None = None, min_link_gbps: float | None = None
) -> list[Verdict]:
    """Each node's verdict, in the order the nodes first appear among the ranks."""
    hosts = list(dict.fromkeys(p.host for p in probes))
    compute = {h: min(p.tflops for p in probes if p.host == h) for h in hosts}
    links = {
        h: [
            p.link_gbps
            for p in probes
            if p.link_gbps > 0 and p.host != p.peer_host and h in (p.host, p.peer_host)
        ]
        for h in hosts
    }
    floor = (1 - tolerance) * statistics.median(compute.values())
    t_ref = max(floor, min_tflops or 0.0)
    every_link = [g for p in probes if p.link_gbps > 0 and p.host != p.peer_host for g in [p.link_gbps]]
    l_floor = (1 - tolerance) * statistics.median(every_link) if every_link else 0.0
    l_ref = max(l_floor, min_link_gbps or 0.0)
    out = []
    for h in hosts:
        why = []
        if compute[h] < t_ref:
            held = "min_tflops" if min_tflops and min_tflops >= floor else f"{1 - tolerance:.2f} x the median"
            why.append(f"compute {compute[h]:.3g} TFLOP/s < {t_ref:.3g} ({held}, tolerance {tolerance:g})")
        worst = min(links[h]) if links[h] else 0.0
        if links[h] and max(links[h]) < l_ref:
            held = (
                "min_link_gbps"
                if min_link_gbps and min_link_gbps >= l_floor
                else f"{1 - tolerance:.2f} x the median"
            )
            why.append(
                f"every link {max(links[h]):.2f} GB/s or less < {l_ref:.2f} ({held}, tolerance {tolerance:g})"
            )
        out.append(Verdict(h, bool(why), compute[h], t_ref, worst, l_ref, "; ".join(why)))
    return out
