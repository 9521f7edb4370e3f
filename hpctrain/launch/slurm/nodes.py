"""Which of a job's nodes are lost, as SLURM sees them (scontrol), for the restart after a failed
job step (restart.py). A node is lost when slurmctld has marked it DOWN, DRAINED or FAILED, or
when it stopped answering (its state carries '*' or NOT_RESPONDING): slurmctld pings every node
each SlurmdTimeout / 3 and takes it down after SlurmdTimeout without an answer."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from hpctrain.config.cluster import SlurmClusterConf
from hpctrain.errors import Problem
from hpctrain.launch.slurm.scheduler import ask
from hpctrain.records import State

LOST_FLAGS = ("DOWN", "DRAIN", "FAIL", "NOT_RESPONDING", "POWER", "REBOOT")


def scontrol(*args: str) -> str:
    """scontrol's output ('' when it cannot answer). A busy slurmctld ("Socket timed out on
    send/recv operation") is asked again with back-off (scheduler.py); a question with no answer
    ("Invalid job id") is asked once."""
    answer = ask(["scontrol", *args], timeout_s=30, patience_s=15)
    return answer.out if answer.ok else ""


def fields(line: str) -> dict[str, str]:
    """One `scontrol show -o` record: Key=value words (a value never holds a space we need)."""
    out: dict[str, str] = {}
    for word in line.split():
        key, eq, value = word.partition("=")
        if eq:
            out.setdefault(key, value)
    return out


def job_state(jid: str) -> State:
    """SLURM's JobState of this job now (UNKNOWN when scontrol cannot tell)."""
    return State.of(fields(scontrol("show", "job", "-o", jid)).get("JobState", ""))


def node_states(text: str) -> dict[str, str]:
    """`scontrol show node -o` -> {node: its State}, e.g. {"n2": "DOWN*+NOT_RESPONDING"}."""
    out = {}
    for line in text.splitlines():
        f = fields(line)
        if "NodeName" in f:
            out[f["NodeName"]] = f.get("State", "")
    return out


def is_lost(state: str) -> bool:
    """Whether a node in `state` (scontrol's words, '+'-joined flags) can run no more steps."""
    words = state.upper().replace("*", "+NOT_RESPONDING").split("+")
    return any(w.startswith(LOST_FLAGS) for w in words if w)


def hostnames(nodelist: str) -> list[str]:
    """A SLURM node list ("n[1-3],n7") expanded."""
    return scontrol("show", "hostnames", nodelist).split() if nodelist and nodelist != "(null)" else []


def job_nodes(jid: str) -> list[str]:
    """The nodes allocated to job `jid` now (its NodeList, expanded): SLURM takes a failed node
    out of a --no-kill job's allocation (the job is resized)."""
    return hostnames(fields(scontrol("show", "job", "-o", jid)).get("NodeList", ""))


def step_env(env: Mapping[str, str], allocated: Sequence[str], world: int) -> dict[str, str]:
    """The batch script's environment for a new step of `world` tasks once the allocation is
    `allocated` (a failed node taken out): srun refuses a SLURM_JOB_NUM_NODES that disagrees with
    the allocation, and takes its task count from SLURM_NTASKS where no flag says otherwise."""
    k, compact = len(allocated), ",".join(allocated)
    out = dict(env)
    out.update(
        SLURM_JOB_NUM_NODES=str(k),
        SLURM_NNODES=str(k),
        SLURM_JOB_NODELIST=compact,
        SLURM_NODELIST=compact,
        SLURM_NTASKS=str(world),
        SLURM_NPROCS=str(world),
    )
    cpus = env.get("SLURM_JOB_CPUS_PER_NODE", "").split("(")[0]
    if cpus.isdigit():
        out["SLURM_JOB_CPUS_PER_NODE"] = f"{cpus}(x{k})"
    out.pop("SLURM_TASKS_PER_NODE", None)  # the old step's; srun sets the new step's own
    return out


def slurmd_timeout_s(default: float = 300.0) -> float:
    """The cluster's SlurmdTimeout (`scontrol show config`: "SlurmdTimeout = 30 sec")."""
    for line in scontrol("show", "config").splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "SlurmdTimeout" and value.split() and value.split()[0].isdigit():
            return float(value.split()[0])
    return default


def settled_losses(
    nodes: Sequence[str],
    wait_s: float,
    show: Callable[..., str] = scontrol,
    sleep: Callable[[float], None] = time.sleep,
) -> list[str]:
    """Those of `nodes` that are lost, once slurmctld has had time to see it: it pings every node
    each SlurmdTimeout / 3 and flags one that does not answer (on the local cluster about 18 s
    after its slurmd died, with SlurmdTimeout 30), so look until a node is flagged or `wait_s`
    (SlurmdTimeout) and a little have passed. Only nodes srun heard nothing from are looked at:
    on a lost node the step's daemon could not report its tasks."""
    waited, step = 0.0, 1.0
    while True:
        states = node_states(show("show", "node", "-o", ",".join(nodes))) if nodes else {}
        lost = [n for n in nodes if is_lost(states.get(n, ""))]
        if lost or not nodes or waited >= wait_s + 2:
            return lost
        sleep(step)
        waited += step


@dataclass(frozen=True)
class Partition:
    """A partition as sinfo shows it: its nodes with their CPUs, and its largest job in nodes
    (MaxNodes; None: no limit, or not said)."""

    cpus: dict[str, int] = field(default_factory=dict)
    max_nodes: int | None = None

    @property
    def nodes(self) -> set[str]:
        return set(self.cpus)


def _max_nodes(size: str) -> int | None:
    """sinfo's %s, a partition's job sizes in nodes ("1-infinite", "1-4", "2+", "4"): the most. Pure."""
    most = size.rpartition("-")[2]
    return int(most) if most.isdigit() else None


def partitions(sinfo_text: str) -> dict[str, Partition]:
    """Partition -> its nodes, from `sinfo -h -N -o %N|%P|%c|%s` (one line per node and
    partition: the node's CPUs and the partition's job sizes; the default partition's name
    carries a '*', kept under "" as well). Pure."""
    out: dict[str, Partition] = {}
    for line in sinfo_text.splitlines():
        node, part, cpus, size = (line.strip().split("|") + ["", "", ""])[:4]
        if not (node and part):
            continue
        for name in (part.rstrip("*"), "") if part.endswith("*") else (part,):
            had = out.get(name, Partition())
            out[name] = Partition({**had.cpus, node: int(cpus) if cpus.isdigit() else 0}, _max_nodes(size))
    return out


def node_problems(cfg: SlurmClusterConf, table: dict[str, Partition]) -> list[Problem]:
    """What sbatch would refuse, or what would pend forever in an allocation the controller
    queues instead (PartitionNodeLimit, PartitionConfig), said before anything is created: a node
    the cluster does not have, more nodes than the partition has or lets one job have, more CPUs
    per node than its nodes have, or an exclusion that leaves too few. Pure."""
    known = set().union(*(t.nodes for t in table.values())) if table else set()
    part = cfg.partition or ""
    pool = table.get(part)
    if not known or pool is None:  # no answer, or a partition the partition rule names
        return []
    where = f"partition {part}" if part else "the default partition"
    p = [
        Problem(f"cluster.nodelist[{i}]", f"{n!r} is not a node of this cluster", f"use one of {', '.join(sorted(known))}")
        for i, n in enumerate(cfg.nodelist)
        if n not in known
    ]  # fmt: skip
    most = min(len(pool.nodes), pool.max_nodes or len(pool.nodes))
    left = pool.nodes - set(cfg.exclude)
    if cfg.nodes > most:
        limit = f"lets a job have {most} (MaxNodes)" if pool.max_nodes == most else f"has {most}"
        p.append(Problem("cluster.nodes", f"asks for {cfg.nodes} nodes; {where} {limit}", f"ask for {most} nodes at most, or another partition (cluster.partition)"))  # fmt: skip
    elif cfg.exclude and len(left) < cfg.nodes:  # the user's own doing
        p.append(
            Problem(
                "cluster.exclude",
                f"leaves {len(left)} of the {len(pool.nodes)} nodes of {where}, and the job asks for {cfg.nodes}",
                "exclude fewer nodes, or ask for fewer (cluster.nodes)",
            )
        )
    cpus, need = max(pool.cpus.values()), cfg.ranks_per_node * cfg.cpus_per_rank
    if 0 < cpus < need:
        p.append(Problem("cluster.ranks_per_node", f"{cfg.ranks_per_node} ranks x {cfg.cpus_per_rank} CPUs (cluster.cpus_per_rank) per node need {need} CPUs; the nodes of {where} have {cpus} at most", f"ask for at most {cpus} CPUs per node: fewer ranks per node or CPUs per rank, and more nodes"))  # fmt: skip
    return p
