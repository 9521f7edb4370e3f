"""One typed record per file of the run-directory contract. Times are in seconds throughout;
the UI converts to milliseconds when it shows them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from hpctrain.records.layout import Layout
from hpctrain.records.parts import Parts, RankParts, StepParts, nest_flat, stage_of
from hpctrain.records.typed import FORMAT_VERSION

# a summary's last loss: the mean of each rank's last steps' losses, then over the ranks (one
# step's loss is one batch's: noisy); its first loss is step 1's, over the ranks
LAST_LOSS_STEPS = 5


@dataclass(frozen=True)
class StepRecord:
    """One line of steps-rank{R}.jsonl: one optimizer step of one rank."""

    step: int
    rank: int
    loss: float
    lr: float
    data_s: float  # waiting for the batch and copying it to the device
    compute_s: float  # forward + backward + update
    comm_s: float  # exposed communication: blocked waiting for gradients after the backward pass
    step_s: float  # the whole step, from the end of the previous one
    samples: int  # samples this rank processed in the step
    samples_per_s: float  # global samples per second of this step
    timed: bool  # False for warm-up steps, which timing statistics leave out
    # what a dimension of the layout measured in the step (records/parts.py: a pipeline's idle,
    # transfers and overhead); none in plain data parallelism
    parts: StepParts = field(default_factory=StepParts)

    migrate = staticmethod(nest_flat("step"))  # records written before parts existed


@dataclass(frozen=True)
class RankSummary:
    """One rank's aggregate over its timed steps (allgathered into the run summary)."""

    rank: int
    host: str
    timed_steps: int
    wall_s: float
    step_s: float
    step_p50_s: float
    step_p95_s: float
    data_s: float
    compute_s: float
    comm_s: float
    first_loss: float
    last_loss: float  # the mean of this rank's last LAST_LOSS_STEPS steps' losses
    peak_memory_bytes: int
    parameters: int
    threads: int = 0  # torch threads of this rank (0: not recorded)
    compile_s: float = 0.0  # seconds torch.compile took on this rank (train.compile; in its warm-up steps)
    # where SLURM's topology plugin places the node: its switches then the node, "s0.s1.n3"
    # (SLURM_TOPOLOGY_ADDR; "": not reported)
    topology: str = ""
    grad_tensors: int = 0  # parameter tensors with gradients
    # after training: median seconds of an allreduce of one value and of the gradients' size
    # (the run's own bandwidth curve for the communication roofline; 0: not measured)
    probe_small_s: float = 0.0
    probe_full_s: float = 0.0
    # mean seconds per step this rank waited in the collective for the slowest rank to arrive
    # (its data + compute against the slowest's, step by step); NaN: not measured (pipelines, older runs)
    wait_s: float = float("nan")
    # rank 0, after training: the share of the data's held-out samples the whole model classifies
    # right (data=digits; None: the data holds none out)
    heldout_accuracy: float | None = None
    # bytes this rank holds at the end of training: parameters, gradients, optimizer state (its
    # shards under fsdp/hsdp; 0: not recorded)
    param_bytes: int = 0
    grad_bytes: int = 0
    optimizer_bytes: int = 0
    # what a dimension of the layout adds for this rank (records/parts.py: a pipeline's stage,
    # idle and link, tensor parallelism's collectives); none in plain data parallelism
    parts: RankParts = field(default_factory=RankParts)

    migrate = staticmethod(nest_flat("rank"))  # records written before parts existed

    @property
    def state_bytes(self) -> int:
        """Parameters + gradients + optimizer state: what ZeRO-3 divides by the shard degree."""
        return self.param_bytes + self.grad_bytes + self.optimizer_bytes


def wire_bytes_per_param(compression: str) -> int:
    """Bytes a gradient puts on the wire per parameter under a parallelism.compression."""
    return 2 if compression in ("fp16", "bf16") else 4


@dataclass(frozen=True)
class RunSummary:
    """summary.json: rank 0's aggregate over all ranks, written last."""

    format_version: int
    world_size: int
    global_batch: int
    batch_per_rank: int
    timed_steps: int
    throughput_samples_per_s: float
    throughput_per_rank: float
    step_s: float
    step_p50_s: float
    step_p95_s: float
    compute_s: float
    comm_s: float
    data_s: float
    compute_share: float
    comm_share: float
    data_share: float
    first_loss: float
    last_loss: float
    peak_memory_bytes: list[int]
    parameters: int
    started: float
    finished: float
    model: str
    precision: str
    backend: str
    compression: str
    per_rank: list[RankSummary]
    engine: str = "horovod"  # what averaged the gradients: horovod | ddp
    parallelism: str = "data"  # data | pipeline | hybrid | fsdp | hsdp
    # what each dimension of the layout adds (records/parts.py): the pipeline's stages, schedule
    # and idle, tensor parallelism's collectives, the shard degree; none in plain data parallelism
    parts: Parts = field(default_factory=Parts)
    threads_per_rank: int = 0  # torch threads per rank (0: not recorded)
    compile_s: float = 0.0  # the slowest rank's torch.compile seconds (train.compile; 0: not compiled)
    grad_tensors: int = 0
    grad_bucket_bytes: int = 0  # Horovod's fusion threshold or DDP's bucket size (0: no fusion)
    probe_small_s: float = 0.0  # see RankSummary
    probe_full_s: float = 0.0
    # load imbalance: mean over ranks of RankSummary.wait_s, a part of comm_s (NaN: not measured)
    imbalance_s: float = float("nan")
    heldout_accuracy: float | None = None  # see RankSummary (rank 0's)
    # as the engine says (engine/base.py): how it groups gradients, "fusion" | "buckets", and the
    # allreduce benchmark's column that times its collective; "" in older records (see below)
    grad_grouping: str = ""
    collective: str = ""
    # what the run cost: from its allocation (nodes x wall time of the training, written by rank
    # 0), or on SLURM from sacct once the job ended (every incarnation, requeues included)
    nodes: int = 0  # distinct hosts of the ranks (0: older records)
    hosts: list[str] = field(default_factory=list)  # their names, sorted ([]: older records)
    # the switches above those hosts, as SLURM's topology reports them (RankSummary.topology
    # without the node), sorted; [] where SLURM reports none
    switches: list[str] = field(default_factory=list)
    node_hours: float = float("nan")
    core_hours: float = float("nan")
    energy_j: float | None = None  # sacct's ConsumedEnergyRaw with an energy plugin; None: not measured
    cost_source: str = ""  # "allocation" | "sacct"
    # restarts after a failure (records/restarts.py): how many, the steps they redid, what they lost
    restarts: int = 0
    start_retries: int = 0  # starts retried once after a rank died before the ranks met (SLURM)
    steps_redone: int = 0
    restart_node_hours_lost: float = 0.0
    nodes_excluded: list[str] = field(default_factory=list)  # judged bad by a pre-flight check
    nodes_lost: list[str] = field(default_factory=list)  # lost mid-run (restarts.jsonl)
    # model FLOPs utilisation (analysis/peak.py): training FLOPs of one sample (FlopCounterMode),
    # what each rank achieved, one device's peak and where it came from, their ratio; None: unknown
    flops_per_sample: float | None = None
    tflops_per_rank: float | None = None
    peak_tflops: float | None = None
    peak_source: str = ""
    mfu: float | None = None
    flops_source: str = ""  # FlopCounterMode, or its count read from the cache

    migrate = staticmethod(nest_flat("run"))  # summaries written before parts existed

    @property
    def grouping(self) -> str:
        # records written before the engine said so came from one of the two engines of the time
        return self.grad_grouping or ("buckets" if self.engine == "ddp" else "fusion")

    @property
    def collective_column(self) -> str:
        return self.collective or ("torch_s" if self.engine == "ddp" else "hvd_s")

    @property
    def peak_by_stage(self) -> tuple[int, ...]:
        """Peak memory of the rank holding most, per pipeline stage (one entry without stages)."""
        stage = [stage_of(r) for r in self.per_rank]
        peaks = [r.peak_memory_bytes for r in self.per_rank]
        return tuple(max(p for p, k in zip(peaks, stage) if k == st) for st in sorted(set(stage)))

    @property
    def grad_bytes_per_param(self) -> int:
        return wire_bytes_per_param(self.compression)

    @property
    def grad_bytes(self) -> int:
        return self.parameters * self.grad_bytes_per_param


@dataclass(frozen=True)
class Batch:
    """Samples per step: per rank, over all ranks, and per backward pass (gradient accumulation)."""

    per_rank: int
    global_: int
    micro: int


@dataclass(frozen=True)
class MemoryBound:
    """The memory check a run passed before it started (orchestrate/validate.py): its worst
    rank's predicted peak, that plus the prediction's error band (what the check held against
    the limit), and the limit each rank has, with the setting it comes from."""

    predicted_bytes: int
    needed_bytes: int
    limit_bytes: int
    limit_key: str


@dataclass(frozen=True)
class RankNeeds:
    """What the ranks need from whatever starts them (launch/needs.py), decided at plan time."""

    mpi: bool = False  # MPI (Horovod over MPI, the allreduce benchmark)
    gloo_rendezvous: bool = False  # the launcher's rendezvous server (Horovod over Gloo)
    torch_store: bool = False  # torch.distributed's store: MASTER_ADDR / MASTER_PORT


@dataclass(frozen=True, kw_only=True)
class RankPlan:
    """What every launcher's plan tells the ranks, declared once: each launcher's plan extends it
    with its own details (launch/local/plan.py JobPlan, launch/slurm/plan.py SlurmPlan), and
    plan.json holds it (PlanRecord)."""

    run_dir: str
    world_size: int
    nodes: int
    ranks_per_node: int
    batch: Batch
    lr: float  # learning rate after scaling, reached at the end of warm-up
    env: dict[str, str]  # variables every rank gets (beyond the launcher's own environment)
    layout: Layout = Layout()  # which rank holds which part of the model (parallel/registry.py)
    notes: list[str] = field(default_factory=list)  # decisions worth telling the user
    needs: RankNeeds | None = None  # None: a plan written before it was recorded
    memory: MemoryBound | None = None  # the memory check it passed (None: none was enforced)


@dataclass(frozen=True, kw_only=True)
class PlanRecord(RankPlan):
    """plan.json: what the ranks read (world size, batch sizes, learning rate, layout) plus the
    launcher's own details (command, environment, sbatch parameters)."""

    EXTRA_KEYS_OK: ClassVar[bool] = True  # launcher-specific keys are kept as they are
    format_version: int
    launcher: str


@dataclass(frozen=True)
class JobRef:
    """job.json: how to find a started run again (status, logs, cancel) from its directory."""

    format_version: int
    launcher: str  # the registry name: local, slurm
    job_id: str
    world_size: int
    folder: str | None = None  # slurm: submitit's folder with the task logs
    pid: int | None = None  # local: the supervisor process (leader of the run's process group)
    pid_start: int | None = None  # local: its start time in clock ticks (guards pid reuse)
    host: str | None = None  # local: where the supervisor runs


@dataclass(frozen=True)
class RemoteRef:
    """remote.json: this machine's record of a run, sweep or study that lives on a cluster behind
    SSH (cluster.remote): where it is, and the hpctrain that made it (status, logs, cancel, pull)."""

    format_version: int
    destination: str  # ssh's destination: user@host or an ~/.ssh/config alias
    remote_dir: str  # its directory there (relative to the remote home, or absolute)
    hpctrain: str  # the hpctrain command there
    version: str  # the version both sides ran
    ssh_config: str | None = None  # the ssh config file (ssh -F), None: the user's


@dataclass(frozen=True)
class Failure:
    rank: int | None
    cause: str
    tail: str = ""


@dataclass(frozen=True)
class LocalState:
    """state.json of a local run, written by its supervisor at every change of state."""

    format_version: int
    state: str  # PENDING RUNNING COMPLETED FAILED CANCELLED
    updated: float
    started: float | None = None
    exit_code: int | None = None
    failure: Failure | None = None
    launch_error: str | None = None  # mpirun could not start at all


@dataclass(frozen=True)
class ErrorRecord:
    """error-rank{R}.json: why a rank failed, written by that rank before it exits."""

    rank: int | None
    host: str
    type: str
    message: str
    traceback: str
    time: float

    def describe(self) -> str:
        first, _, rest = self.message.partition("\n")  # details (e.g. stacks) after the host
        return f"{self.type}: {first} (on {self.host})" + (f"\n{rest}" if rest else "")


@dataclass(frozen=True)
class ArrayRef:
    array_id: str
    size: int


@dataclass(frozen=True)
class SweepRun:
    index: int
    overrides: list[str]
    run_dir: str
    job_id: str
    array: int = 0


@dataclass(frozen=True)
class SweepManifest:
    """sweep.json: the runs of a sweep (or of one study attempt) and their jobs."""

    format_version: int
    sweep_dir: str
    launcher: str
    runs: list[SweepRun]
    arrays: list[ArrayRef] = field(default_factory=list)


@dataclass(frozen=True)
class StudyRun:
    name: str
    scale: int
    rep: int
    world_size: int
    overrides: list[str]
    run_dir: str


@dataclass(frozen=True)
class StudyManifest:
    """study.json: the runs of a scaling study."""

    format_version: int
    kind: str  # strong | weak
    launcher: str
    runs: list[StudyRun]
    config_dir: str | None = None
    allreduce_bench: bool = True
    allreduce_max_mb: int = 256
    # study.one_allocation: the allocations its points ran in, one per attempt (a study killed
    # mid-way and resumed ran in two); [] without one
    allocations: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class AllreduceRow:
    n: int
    bytes: int
    iters: int
    hvd_s: float
    mpi_s: float
    torch_s: float = float("nan")  # torch.distributed all_reduce (Gloo/NCCL); NaN in older records
    # torch.distributed all_gather_into_tensor and reduce_scatter_tensor of `bytes` in all (FSDP's
    # collectives); NaN in older records
    allgather_s: float = float("nan")
    reduce_scatter_s: float = float("nan")


@dataclass(frozen=True)
class AllreduceResult:
    """allreduce-n{N}.json: the allreduce benchmark on N ranks."""

    format_version: int
    n: int
    mpi_library: str
    rows: list[AllreduceRow]
    device: str = "cpu"  # where torch.distributed and Horovod reduced (cuda: device tensors, NCCL)


def new(cls: Any, **values: Any) -> Any:
    """A record of the current format version."""
    return cls(format_version=FORMAT_VERSION, **values)
