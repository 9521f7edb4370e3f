"""The scheduler's limits that decide how a sweep can be submitted, read before anything is.

    MaxArraySize    (scontrol show config) an array's indices run 0..MaxArraySize-1: a larger
                    sweep goes out as several arrays (SLURM's default is 1001)
    MaxSubmitJobs   (sacctmgr: the user's association and QOS) pending + running jobs a user may
                    have; every array task counts, so a sweep that would exceed it is refused
    rl_*            (scontrol show config: SlurmctldParameters) the controller's per-user RPC
                    limit, where it has one (SLURM 23.02+): hpctrain keeps to half of it

Parsers are pure; `read_limits` runs the commands and tolerates a cluster without accounting.
"""

from __future__ import annotations

import getpass
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from hpctrain.launch.slurm.scheduler import query

SLURM_DEFAULT_MAX_ARRAY_SIZE = 1001  # slurm.conf(5) MaxArraySize


@dataclass(frozen=True)
class Limits:
    max_array_size: int
    max_submit_jobs: int | None  # None: no limit set (or no accounting to ask)
    queued: int  # jobs (array tasks included) the user has pending or running now
    source: str  # where max_array_size came from, for the dry run
    rpc_per_min: float | None = None  # the controller's per-user RPC limit (rl_enable), if any

    def arrays(self, n: int) -> list[range]:
        """Indices of an n-run group, split into arrays the scheduler accepts."""
        size = max(1, self.max_array_size)
        return [range(lo, min(n, lo + size)) for lo in range(0, n, size)]

    def room(self) -> int | None:
        return None if self.max_submit_jobs is None else max(0, self.max_submit_jobs - self.queued)


def parse_max_array_size(config_text: str) -> int | None:
    """MaxArraySize from `scontrol show config` ("MaxArraySize            = 1001")."""
    for line in config_text.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "MaxArraySize" and value.strip().isdigit():
            return int(value.strip())
    return None


def parse_rpc_limit(config_text: str) -> float | None:
    """RPCs a minute a user may send, from `scontrol show config`'s SlurmctldParameters when it
    enables slurmctld's rate limiter: rl_refill_rate tokens every rl_refill_period seconds
    (slurm.conf(5): defaults 2 and 1); None when the limiter is off (or the version lacks it)."""
    for line in config_text.splitlines():
        key, _, value = line.partition("=")
        if key.strip() != "SlurmctldParameters":
            continue
        params: dict[str, str] = {}
        for item in value.strip().split(","):
            name, _, setting = item.partition("=")
            params[name.strip()] = setting.strip()
        if "rl_enable" not in params:
            return None
        rate, period = params.get("rl_refill_rate", "2"), params.get("rl_refill_period", "1")
        if rate.isdigit() and period.isdigit() and int(period) > 0:
            return 60.0 * int(rate) / int(period)
    return None


def parse_max_submit(text: str) -> int | None:
    """The smallest MaxSubmitJobs of `sacctmgr -n -P show assoc|qos format=MaxSubmit...` lines
    (empty fields: no limit)."""
    values = [int(v) for line in text.splitlines() for v in line.split("|") if v.strip().isdigit()]
    return min(values) if values else None


def ranges_text(indices: list[int]) -> str:
    """1,2,3,7,9,10 -> "1-3,7,9-10" (what a dry run prints for a large sweep)."""
    out: list[str] = []
    start = prev = None
    for i in sorted(indices):
        if prev is not None and i == prev + 1:
            prev = i
            continue
        if start is not None:
            out.append(f"{start}" if start == prev else f"{start}-{prev}")
        start = prev = i
    if start is not None:
        out.append(f"{start}" if start == prev else f"{start}-{prev}")
    return ",".join(out)


def read_limits(qos: str | None = None) -> Limits:
    """The limits for this user (and `qos`, else the association's default QOS). The controller's
    config, the user's associations, every QOS's limit and the user's queued jobs are asked at
    once (each SLURM client call costs ~0.15 s of start-up and authentication: one round, not two;
    the queue is counted only where a limit holds)."""
    user = getpass.getuser()
    asks = [
        ["scontrol", "show", "config"],
        ["sacctmgr", "-n", "-P", "show", "assoc", f"user={user}", "format=MaxSubmit,DefaultQOS,QOS"],
        ["sacctmgr", "-n", "-P", "show", "qos", "format=Name,MaxSubmitPU"],
        ["squeue", "-h", "-r", "-u", user, "-t", "PENDING,RUNNING", "-o", "%i"],
    ]
    with ThreadPoolExecutor(len(asks)) as pool:
        config, assoc, qos_table, squeue = (text or "" for text in pool.map(query, asks))
    size = parse_max_array_size(config)
    source = "the cluster's MaxArraySize" if size else "SLURM's default MaxArraySize (no controller answered)"
    for line in assoc.splitlines():
        _, default, allowed = ([*line.split("|"), "", ""])[:3]
        qos = qos or default.strip() or allowed.split(",")[0].strip() or None
    qos_text = "\n".join(
        line.split("|", 1)[1] for line in qos_table.splitlines() if qos and line.split("|")[0] == qos
    )
    limit = parse_max_submit("\n".join(line.split("|")[0] for line in assoc.splitlines()) + "\n" + qos_text)
    queued = len(squeue.split()) if limit is not None else 0
    return Limits(size or SLURM_DEFAULT_MAX_ARRAY_SIZE, limit, queued, source, parse_rpc_limit(config))
