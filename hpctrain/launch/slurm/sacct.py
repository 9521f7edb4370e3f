"""Reading SLURM's accounting and queue: small pure parsers over real `sacct -P`, `squeue` and
`scontrol show job` text, and the functions that ask (through scheduler.py)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from hpctrain.launch.base import DONE
from hpctrain.launch.slurm.nodes import fields
from hpctrain.launch.slurm.scheduler import ask
from hpctrain.records import State

SACCT_FIELDS = ("JobID", "JobName", "State", "NNodes", "Elapsed", "ExitCode", "NodeList", "Reason")

# squeue(1) JOB REASON CODES: why a job is pending. True: it can never start as submitted (its
# request exceeds a partition, QOS or association limit); False: it waits its turn.
PENDING_REASONS: dict[str, tuple[str, bool]] = {
    "PartitionConfig": ("the job asks for more than its partition has (nodes, CPUs or GPUs)", True),
    "PartitionNodeLimit": ("more nodes than the partition allows per job", True),
    "PartitionTimeLimit": ("a longer time limit than the partition allows", True),
    "BadConstraints": ("the constraints (cluster.constraint) match no node", True),
    "InvalidAccount": ("the account does not exist or is not yours", True),
    "InvalidQOS": ("the QOS does not exist or is not allowed", True),
    "QOSMaxNodePerJobLimit": ("more nodes than the QOS allows per job", True),
    "QOSMaxWallDurationPerJobLimit": ("a longer time limit than the QOS allows", True),
    "AssocMaxNodesPerJobLimit": ("more nodes than your association allows per job", True),
    "AssocMaxWallDurationPerJobLimit": ("a longer time limit than your association allows", True),
    "DependencyNeverSatisfied": ("a job it waits for (run.after, :ok) failed or was cancelled", True),
    "Dependency": ("waiting for the jobs it starts after (run.after) to end", False),
    "Resources": ("waiting for nodes to become free", False),
    "Priority": ("jobs of higher priority go first", False),
    "JobArrayTaskLimit": ("the array's cluster.array_parallelism tasks are running", False),
    "BeginTime": ("waiting for its start time", False),
    "ReqNodeNotAvail": ("the nodes it needs are unavailable (down, drained or reserved)", False),
    "PartitionDown": ("the partition is down", False),
    "QOSMaxJobsPerUserLimit": ("you have as many running jobs as the QOS allows", False),
    "AssocMaxJobsLimit": ("you have as many running jobs as your association allows", False),
}


# what to do about a job that can never start as submitted: change what it asks for, except...
CHANGE_THE_REQUEST = (
    "change the request (cluster.partition, cluster.nodes, cluster.time_min, ...) and submit again"
)
NEVER_FIX = {
    "DependencyNeverSatisfied": "submit it again once the runs it starts after complete, or start after them with :any",
}


def blocked_fix(reason: str) -> str:
    return NEVER_FIX.get(reason, CHANGE_THE_REQUEST)


def explain_pending(reason: str) -> tuple[str, bool]:
    """(text for the user, whether the job can never start) for sacct's Reason of a pending job."""
    text, never = PENDING_REASONS.get(reason, ("", False))
    return (f"{reason}: {text}" if text else reason), never


@dataclass(frozen=True)
class JobState:
    job_id: str  # "123", or "123_4" for an array task
    name: str
    state: State  # sacct's State as one of ours ("CANCELLED by 0" -> State.CANCELLED)
    nodes: int
    elapsed: str
    exit_code: str
    nodelist: str
    reason: str = ""  # why it is pending (sacct's Reason; "None" otherwise)
    note: str = ""  # what the status rests on when it is not accounting ("accounting unavailable ...")

    @property
    def done(self) -> bool:
        return self.state in DONE


def parse_sacct(text: str, steps: frozenset[str] = frozenset()) -> dict[str, JobState]:
    """`sacct -P -n -o <SACCT_FIELDS>` output -> states by job id: allocations, and of the job
    steps (ALLOC.STEP) only those in `steps` (runs started as steps: allocation.py)."""
    out: dict[str, JobState] = {}
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) != len(SACCT_FIELDS) or ("." in parts[0] and parts[0] not in steps):
            continue
        jid, name, state, nodes, elapsed, code, nodelist, reason = parts
        out[jid] = JobState(
            jid,
            name,
            State.of(state),
            int(nodes) if nodes.isdigit() else 0,
            elapsed,
            code,
            nodelist,
            reason if reason != "None" else "",
        )
    return out


def _task_in(task: str, spec: str) -> bool:
    """Whether array task `task` is in sacct's task list `spec`, e.g. "[0-15]", "[3-5,7%2]"."""
    if not task.isdigit():
        return False
    for part in spec.strip("[]").split("%")[0].split(","):
        lo, _, hi = part.partition("-")
        if lo.isdigit() and (hi or lo).isdigit() and int(lo) <= int(task) <= int(hi or lo):
            return True
    return False


def with_array_tasks(requested: list[str], states: dict[str, JobState]) -> dict[str, JobState]:
    """Array tasks that never started have no record of their own: sacct shows the array's
    unsplit rest as one record, "123" (none split off yet) or "123_[4-15]". Give each such task
    that record's state (a pending array cancelled as a whole is CANCELLED, not pending forever),
    except that of a task which ran: the array's first record is also the first task to start,
    and until slurmdbd has another task's own record (it lags) it can still list that task in its
    rest, with the state of the one that ran (seen: an array's task 0 COMPLETED while it ran)."""
    out = dict(states)
    for jid in requested:
        array, _, task = jid.partition("_")
        if jid in out or not task:
            continue
        rest = [
            s
            for k, s in states.items()
            if k == array or (k.startswith(f"{array}_[") and _task_in(task, k[len(array) + 1 :]))
        ]
        if rest:
            ran = rest[0].state in (State.RUNNING, State.COMPLETED)
            out[jid] = replace(rest[0], job_id=jid, state=State.PENDING if ran else rest[0].state)
    return out


def accounting(job_ids: list[str]) -> tuple[dict[str, JobState] | None, str]:
    """(the state of each job accounting knows, ""), or (None, why) when accounting does not
    answer (no slurmdbd configured, or it is down). An array task is asked for by its array's id
    (sacct lists every task of it, and the unsplit rest of its pending ones), so 10,000 tasks make
    a short command."""
    query_ids = ",".join(sorted({j.split("_")[0] for j in job_ids}))
    steps = frozenset(j for j in job_ids if "." in j)  # asked for by id: sacct lists the step alone
    argv = ["sacct", *([] if steps else ["-X"]), "-P", "-n", "-o", ",".join(SACCT_FIELDS), "-j", query_ids]
    answer = ask(argv, patience_s=30)
    if not answer.ok:
        return None, answer.why()
    found = with_array_tasks(job_ids, parse_sacct(answer.out, steps))
    return {j: found[j] for j in job_ids if j in found}, ""


SQUEUE_FORMAT = "%i|%j|%T|%D|%M|%N|%r"
ENDED = State.ENDED  # left the queue while accounting could not say how: the run's records tell


def parse_squeue(text: str) -> dict[str, JobState]:
    """`squeue -h -r -o <SQUEUE_FORMAT>` output -> live jobs by id (array tasks one per line)."""
    out: dict[str, JobState] = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) != 7:
            continue
        jid, name, state, nodes, elapsed, nodelist, reason = parts
        reason = reason if State.of(state) == State.PENDING and reason != "None" else ""
        out[jid] = JobState(
            jid, name, State.of(state), int(nodes) if nodes.isdigit() else 0, elapsed, "", nodelist, reason
        )
    return out


def parse_scontrol_jobs(text: str) -> dict[str, JobState]:
    """`scontrol show job -o` (every job the controller still holds, ended ones for MinJobAge
    seconds) -> states by job id; an array task as ARRAY_TASK."""
    out: dict[str, JobState] = {}
    for line in text.splitlines():
        f = fields(line)
        if "JobId" not in f:
            continue
        task = f.get("ArrayTaskId", "")
        jid = f"{f['ArrayJobId']}_{task}" if task.isdigit() and "ArrayJobId" in f else f["JobId"]
        reason = f.get("Reason", "")
        nodes = f.get("NumNodes", "")
        out[jid] = JobState(
            jid,
            f.get("JobName", ""),
            State.of(f.get("JobState", "")),
            int(nodes) if nodes.isdigit() else 0,
            f.get("RunTime", ""),
            f.get("ExitCode", ""),
            f.get("NodeList", ""),
            reason if reason != "None" else "",
        )
    return out


def remembered(job_ids: list[str]) -> dict[str, JobState]:
    """What the controller still knows of these jobs (one `scontrol show job -o` for all)."""
    answer = ask(["scontrol", "show", "job", "-o"], patience_s=30)
    known = parse_scontrol_jobs(answer.out) if answer.ok else {}
    return {j: known[j] for j in job_ids if j in known}


# --- what a job cost -------------------------------------------------------------------------
COST_FIELDS = ("JobID", "ElapsedRaw", "NNodes", "AllocCPUS", "ConsumedEnergyRaw")


@dataclass(frozen=True)
class Usage:
    """A job's accounting summed over its incarnations (a requeued job runs several times)."""

    node_hours: float
    core_hours: float
    energy_j: float | None  # None: no energy plugin (sacct reports 0 or nothing): not measured
    incarnations: int


def parse_usage(text: str, job_id: str) -> Usage | None:
    """`sacct -j JOB --duplicates -X -n -P -o COST_FIELDS` text -> the job's usage (None: no row)."""
    node_s = core_s = energy = 0.0
    n, measured = 0, False
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) != len(COST_FIELDS) or parts[0] != job_id:
            continue
        elapsed, nodes, cpus, joules = (p.strip() for p in parts[1:])
        if not (elapsed.isdigit() and nodes.isdigit() and cpus.isdigit()):
            continue
        n += 1
        node_s += int(elapsed) * int(nodes)
        core_s += int(elapsed) * int(cpus)
        if joules.isdigit() and int(joules) > 0:
            energy += int(joules)
            measured = True
    if not n:
        return None
    return Usage(node_s / 3600, core_s / 3600, energy if measured else None, n)


def job_usage(job_id: str) -> Usage | None:
    """The job's usage from accounting (None: accounting does not answer or knows no such job)."""
    # a job step's own row is not an allocation's (-X would hide it)
    argv = ["sacct", "-j", job_id, "--duplicates", *([] if "." in job_id else ["-X"]), "-n", "-P"]
    answer = ask([*argv, "-o", ",".join(COST_FIELDS)], timeout_s=30)
    return parse_usage(answer.out, job_id) if answer.ok else None
