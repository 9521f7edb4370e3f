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
is the one to blame (with two nodes, their one pair of links condemns both). An earlier check of
the same config (cluster.preflight.reference: a run or a study) is a reference too: a node is
then held to (1 - tolerance) x what the good nodes measured there, so a job whose nodes are all
slow, which its own median cannot tell, is caught."""

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


@dataclass(frozen=True)
class Reference:
    """What nodes measured in an earlier check of the same config (cluster.preflight.reference):
    the median good node's compute and inter-node link."""

    tflops: float
    link_gbps: float  # 0: no link was measured there
    source: str  # the run or study it came from, as the verdict names it


def reference_of(checks: list[dict[str, object]], source: str) -> Reference | None:
    """The Reference of earlier checks (preflight.json lines); None when no node was good."""
    good = [v for c in checks for v in _list(c.get("verdicts")) if isinstance(v, dict) and not v.get("bad")]
    tflops = [float(v["tflops"]) for v in good if _positive(v.get("tflops"))]
    links = [float(v["link_gbps"]) for v in good if _positive(v.get("link_gbps"))]
    if not tflops:
        return None
    return Reference(statistics.median(tflops), statistics.median(links) if links else 0.0, source)


def _list(x: object) -> list[object]:
    return x if isinstance(x, list) else []


def _positive(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and x > 0 and x == x


def _held(floors: list[tuple[float, str]]) -> tuple[float, str]:
    """The highest of the floors a value is held to, and what it is."""
    return max(floors, key=lambda f: f[0])


def judge(
    probes: list[Probe],
    tolerance: float,
    min_tflops: float | None = None,
    min_link_gbps: float | None = None,
    reference: Reference | None = None,
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
    keep = 1 - tolerance
    t_floors = [(keep * statistics.median(compute.values()), f"{keep:.2f} x the median")]
    t_floors.append((min_tflops or 0.0, "min_tflops"))
    every_link = [p.link_gbps for p in probes if p.link_gbps > 0 and p.host != p.peer_host]
    l_floors = [(keep * statistics.median(every_link) if every_link else 0.0, f"{keep:.2f} x the median")]
    l_floors.append((min_link_gbps or 0.0, "min_link_gbps"))
    if reference is not None:
        t_floors.append(
            (keep * reference.tflops, f"{keep:.2f} x {reference.tflops:.3g} in {reference.source}")
        )
        l_floors.append(
            (keep * reference.link_gbps, f"{keep:.2f} x {reference.link_gbps:.2f} in {reference.source}")
        )
    (t_ref, t_held), (l_ref, l_held) = _held(t_floors), _held(l_floors)
    out = []
    for h in hosts:
        why = []
        if compute[h] < t_ref:
            why.append(f"compute {compute[h]:.3g} TFLOP/s < {t_ref:.3g} ({t_held}, tolerance {tolerance:g})")
        worst = min(links[h]) if links[h] else 0.0
        if links[h] and max(links[h]) < l_ref:
            why.append(
                f"every link {max(links[h]):.2f} GB/s or less < {l_ref:.2f} ({l_held}, tolerance {tolerance:g})"
            )
        out.append(Verdict(h, bool(why), compute[h], t_ref, worst, l_ref, "; ".join(why)))
    return out
