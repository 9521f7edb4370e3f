"""The typed configuration schema. YAML files in conf/ extend these dataclasses.

Schema only: defaults and one comment per field. Cross-field rules live in validate.py.
Units are in key names (`_mb`, `_ms`, `_min`), as in Hydra's submitit launcher.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Dict, List, Optional

from omegaconf import MISSING

from hpctrain.config.cluster import (  # noqa: F401  (re-exported: the `cluster` group's schemas)
    ClusterConf,
    LocalClusterConf,
    PreflightConf,
    SlurmClusterConf,
)
from hpctrain.config.container import ContainerConf  # noqa: F401  (re-exported)
from hpctrain.config.observe import ProfileConf, TrackingConf
from hpctrain.config.options import (  # noqa: F401  (re-exported: the schema's option sets)
    IMAGE_DATASETS,
    IMAGE_MODELS,
    TOKEN_DATASETS,
    TOKEN_MODELS,
    Backend,
    CompileMode,
    Compression,
    Dataset,
    Device,
    ElasticKeeps,
    FailMode,
    LossKind,
    LrScaling,
    Model,
    MpiPlugin,
    Optimizer,
    Precision,
    RankStarter,
    Schedule,
    StudyKind,
)
from hpctrain.facts import importable


@dataclass
class ModelConf:
    name: Model = Model.cnn  # a built-in model (conf/model/); ignored when _target_ is set
    width: int = 16  # first conv channels (cnn, resnet), hidden units (mlp), d_model (transformer)
    depth: int = 2  # hidden layers (mlp), encoder layers (transformer); cnn/resnet ignore it
    heads: int = 4  # attention heads (transformer); width must be divisible by it
    # transformer: the output head shares the token embedding's weight (GPT-2's tied embeddings)
    tie_embeddings: bool = False
    channels_last: bool = False  # NHWC memory format for conv models (tensor cores on GPUs)
    # recompute each block's activations in the backward pass instead of keeping them
    # (torch.utils.checkpoint): less memory, about one more forward pass of compute
    activation_checkpointing: bool = False
    # the blocks that checkpointing wraps, by module name (user models; built-in models declare theirs)
    checkpoint_blocks: List[str] = field(default_factory=list)
    # Your own model instead of `name`: a class or factory by import path (Hydra's instantiate),
    # e.g. model._target_=mypkg.nets.Net +model.hidden=64 (extra keys are its keyword arguments)
    _target_: Optional[str] = None
    kwargs: Dict[str, Any] = field(default_factory=dict)  # the _target_'s keyword arguments


@dataclass
class DataConf:
    name: Dataset = Dataset.synthetic  # a built-in dataset (conf/data/); ignored when _target_ is set
    num_samples: int = 2048  # size of a synthetic dataset (synthetic, tokens)
    channels: int = 3  # image channels (digits: 1)
    image_size: int = 32  # image height = width in pixels (digits: 8)
    num_classes: int = 10  # label classes (images)
    seq_len: int = 64  # tokens per sample (tokens)
    vocab_size: int = 256  # token vocabulary (tokens)
    path: Optional[str] = None  # folder: a directory with one sub-directory of images per class
    num_workers: int = 0  # DataLoader worker processes per rank (0 = load in the training process)
    prefetch_factor: int = 2  # batches each worker loads ahead (needs num_workers > 0)
    pin_memory: bool = False  # page-locked host memory for faster host-to-GPU copies
    shuffle: bool = True  # reshuffle the (global) sample order every epoch
    # Your own data instead of `name`: a callable returning a map-style torch Dataset of
    # (input, target) pairs, e.g. data._target_=mypkg.data.make_dataset +data.n=4096
    _target_: Optional[str] = None
    kwargs: Dict[str, Any] = field(default_factory=dict)  # the _target_'s keyword arguments


@dataclass
class LossConf:
    """The training loss (conf/loss/): cross_entropy over the model's output (or your loss
    function, _target_), or model: the model computes its own (train/objective.py)."""

    name: LossKind = LossKind.cross_entropy  # what a step minimises (conf/loss/)
    # cross_entropy: your loss function instead, called as LOSS(outputs, targets), e.g.
    # torch.nn.MSELoss, or mypkg.losses.Focal +loss.gamma=2
    _target_: Optional[str] = None
    kwargs: Dict[str, Any] = field(default_factory=dict)  # the _target_'s keyword arguments
    # model: the keyword the forward takes the targets as (labels for Hugging Face models);
    # null: its second positional argument, forward(inputs, targets) (GPT-2 style)
    targets_as: Optional[str] = None


@dataclass
class CodeConf:
    """Where the user's own code lives (model/data/loss _target_s, script.path)."""

    dir: Optional[str] = None  # put on every rank's PYTHONPATH; null = the current directory
    # copy the code into the run (or sweep) directory at submission and run that copy, so edits
    # after sbatch change no queued or requeued job; null = on for SLURM, off for local runs
    snapshot: Optional[bool] = None
    include: List[str] = field(default_factory=list)  # globs to copy; empty = git's tracked files


@dataclass
class ScriptConf:
    """Run your own distributed training script on every rank instead of the built-in trainer."""

    path: Optional[str] = None  # hpctrain run script=train.py; null = the built-in trainer
    args: List[str] = field(default_factory=list)  # its command-line arguments, one per item
    # the script's throughput as it prints it: a regular expression whose first group is samples/s
    # (rank 0's output, last match); scripts using hpctrain.api report steps instead
    throughput_regex: Optional[str] = None
    # a rank with no api.step, no output and no CPU use (its processes) for this long is stalled:
    # the run ends naming it, with its Python stack (workload/script_watch.py); 0 = off
    stall_timeout_s: float = 600.0


@dataclass
class PrecisionConf:
    name: Precision = Precision.fp32  # fp16/bf16 use autocast
    init_scale: float = 65536.0  # fp16: initial loss scale of the gradient scaler
    growth_interval: int = 2000  # fp16: steps without overflow before the loss scale doubles


@dataclass
class HorovodSettings:
    """engine=horovod's own settings (given to another engine, they are refused)."""

    fusion_threshold_mb: Optional[float] = None  # HOROVOD_FUSION_THRESHOLD; null = Horovod's 64 MB
    cycle_time_ms: Optional[float] = None  # HOROVOD_CYCLE_TIME; null = Horovod's default


@dataclass
class DdpSettings:
    """engine=ddp's own settings (given to another engine, they are refused)."""

    bucket_mb: float = 25.0  # gradient bucket size (DDP's bucket_cap_mb)
    gradient_as_bucket_view: bool = False  # gradients alias the buckets (saves a copy and memory)
    static_graph: bool = False  # the graph never changes between steps (lets DDP skip some work)


@dataclass
class PipelineSettings:
    """parallelism=pipeline | hybrid: the world is stages x replicas (hybrid: replicas >= 2)."""

    label: ClassVar[str] = "pipeline"  # what foreign-setting refusals call these (parallel/rules.py)

    stages: int = 1  # pipeline ranks one sample goes through
    microbatches: int = 1  # micro-batches each replica's batch is cut into, in flight at once
    # the order of micro-batches' forward and backward chunks (config/layout.py: SCHEDULES)
    schedule: Schedule = Schedule.gpipe  # type: ignore[attr-defined]
    virtual_stages: int = 1  # interleaved_1f1b (2 or more), interleaved_zb: model pieces per pipeline rank
    # where a new stage begins: module names (model.named_modules()); empty = the model's declared
    # split points (built-in models), spread evenly
    split_at: List[str] = field(default_factory=list)


@dataclass
class ShardSettings:
    """parallelism=fsdp | hsdp: PyTorch's FSDP2 (fully_shard) over a device mesh."""

    # ranks one shard group spans; null = fsdp: the whole world, hsdp: the ranks of one node
    degree: Optional[int] = None
    # after forward, free the gathered parameters (true), keep them (false), or keep them sharded
    # over this many ranks (an int dividing the degree): FSDP2's reshard_after_forward
    reshard_after_forward: Any = True
    # module names or class names sharded as units, bottom-up; [] = the built-in model's blocks
    modules: List[str] = field(default_factory=list)
    cpu_offload: bool = False  # sharded parameters, gradients and optimizer state live in host memory


@dataclass
class ShardHolder:
    label: ClassVar[str] = "sharding"
    shard: ShardSettings = field(default_factory=ShardSettings)


@dataclass
class TensorParallelSettings:
    """parallelism.tp: tensor parallelism (Megatron-LM's column/row split of each layer's matrices,
    torch.distributed.tensor.parallel) over groups of consecutive ranks, with parallelism=data
    (one replica) or fsdp/hsdp (2-D: TP inside a node x sharding across)."""

    degree: int = 1  # ranks one tensor-parallel group spans (consecutive: a group stays on a node); 1 = off
    # norms and the residual stream split along the sequence between the tensor-parallel regions
    # (Korthikanti et al. 2022): less activation memory, all-gather/reduce-scatter instead of all-reduce
    sequence_parallel: bool = False
    # a user model's plan: module name (fnmatch wildcards over repeated blocks, e.g. layers.*.w1) ->
    # colwise | rowwise | colwise_gather (an output gathered whole, e.g. a head) | colwise_fused:K
    # (K matrices side by side, e.g. a fused q/k/v: colwise_fused:3); {} = the built-in model's
    plan: Dict[str, str] = field(default_factory=dict)
    # module attributes that count heads or width, divided by the degree on each rank (a split
    # attention's local head count), as module.attribute with wildcards, e.g. [h.*.attn.n_head]
    divide: List[str] = field(default_factory=list)


@dataclass
class TpHolder:
    label: ClassVar[str] = "tensor-parallel"
    tp: TensorParallelSettings = field(default_factory=TensorParallelSettings)


def default_engine() -> str:
    """Horovod, the mission's engine, where it is installed; torch's DDP where it is not (a fresh
    `pip install hpctrain`: `hpctrain install horovod` builds it), so that a first run trains."""
    return "horovod" if importable("horovod") else "ddp"


@dataclass
class ParallelismCommon:
    name: str = "data"  # how the model is spread: a registered parallelism (parallel/registry.py)
    # what averages gradients: horovod | ddp (engine/registry.py); by default Horovod where it is
    # installed, else DDP
    engine: str = field(default_factory=default_engine)
    backend: Backend = Backend.mpi  # horovod and scripts: controller and CPU collectives (ddp: Gloo/NCCL)
    compression: Compression = Compression.none  # gradient compression on the wire
    backward_passes_per_step: int = 1  # micro-batches accumulated locally before one allreduce
    # a parallelism from another package: its own settings, checked against the dataclass it names
    # (parallel/base.py: ParallelismKind.options); the built-in ones take none
    options: Dict[str, Any] = field(default_factory=dict)


@dataclass
class ParallelismConf(
    TpHolder, ShardHolder, PipelineSettings, DdpSettings, HorovodSettings, ParallelismCommon
):
    """How the work is spread: the parallelism and the engine, and each one's own settings. The
    keys stay flat (parallelism.<key>); an engine or a parallelism reads only its own group of them
    and refuses another's before anything starts (engine.base.Engine.settings)."""


def with_dimension_settings(base: type[Any]) -> type[Any]:
    """`base` with the settings of the dimensions that are packages of their own (their
    parallelism.<name>.* keys: <package>.settings:HOLDER, hpctrain/dimension_packages.py), as one
    dataclass of the same name: the schema's unknown keys stay errors, and theirs are known."""
    from hpctrain.dimension_packages import with_settings
    from hpctrain.registry import load

    holders = tuple(load(t) for t in with_settings().values())
    if not holders:
        return base
    ns = {"__doc__": base.__doc__, "__module__": base.__module__, "__qualname__": base.__qualname__}
    return dataclass(type(base.__name__, (*holders, base), ns))


if not TYPE_CHECKING:  # the type checker sees the built-in groups; the dimensions' read their own
    ParallelismConf = with_dimension_settings(ParallelismConf)


@dataclass
class OptimConf:
    name: Optimizer = Optimizer.sgd  # the optimizer (conf/optim/): torch.optim's class of that name
    lr: float = 0.05  # learning rate at the reference batch
    momentum: float = 0.9  # sgd, rmsprop
    weight_decay: float = 0.0  # L2 penalty (sgd, adam, adagrad, rmsprop), decoupled weight decay (adamw)
    betas: List[float] = field(default_factory=lambda: [0.9, 0.999])  # adam, adamw
    eps: float = 1e-8  # added to the denominator (adam, adamw, adagrad, rmsprop)
    nesterov: bool = False  # sgd: Nesterov momentum
    alpha: float = 0.99  # rmsprop: smoothing constant of the squared-gradient average
    lr_scaling: LrScaling = LrScaling.none  # linear: lr x global_batch / reference_batch (Goyal et al. 2017)
    reference_batch: Optional[int] = None  # batch that `lr` was tuned for; null = per-rank batch
    warmup_steps: int = 0  # linear learning-rate warm-up from `lr` to the scaled lr
    # Your own optimizer instead of `name`: a class by import path, built as
    # CLASS(parameters, lr=<the scaled lr>, **kwargs), e.g. optim._target_=mypkg.opt.Lion +optim.kwargs.betas=[0.9,0.99]
    _target_: Optional[str] = None
    kwargs: Dict[str, Any] = field(default_factory=dict)  # the _target_'s keyword arguments besides lr


@dataclass
class TrainConf:
    steps: int = 50  # optimizer steps
    warmup_steps: int = 5  # first steps excluded from timing statistics
    seed: int = 0  # seeds the model's initial weights, the data order and synthetic data
    log_interval: int = 10  # steps between rank-0 log lines
    batch_per_rank: Optional[int] = 32  # samples per rank per step; set this or global_batch
    global_batch: Optional[int] = None  # samples per step over all ranks; set this or batch_per_rank
    device: Device = Device.auto  # auto: CUDA when present
    save_model: bool = True  # rank 0 writes model.pt at the end
    # start from a checkpoint (a step-*.pt file, a step-*.dcp directory, or a run directory: its
    # latest): weights, optimizer state and step, resharded to this run's world; a run's own
    # checkpoints (after a requeue) come first
    resume_from: Optional[str] = None
    stop_on_nonfinite_loss: bool = True  # a NaN/inf loss ends the run, naming the step and rank
    # torch.compile each of the model's blocks (model.checkpoint_blocks, or a built-in model's
    # own), else the whole model; its inductor cache lives in the run directory (cache/), so a
    # requeued run reuses it; compile time is recorded apart from the steps' (warm-up)
    compile: bool = False
    compile_mode: CompileMode = CompileMode.default  # default | reduce-overhead | max-autotune | ...
    # no step completed for this long: the run ends, naming the stalled rank(s); the torch engines'
    # ranks must also meet within it (engine/rendezvous.py); 0 = off
    stall_timeout_s: float = 300.0
    # a rank or node that dies (a signal, a lost peer, a stall; not an error of the code) restarts
    # the run from its newest checkpoint, at most this many times (records/restarts.py)
    max_restarts: int = 0
    # a restart after a lost node continues on the nodes left (SLURM) instead of waiting in the
    # queue for the full size (parallel/elastic.py); min_ranks: the fewest it goes on with
    elastic: bool = False
    min_ranks: Optional[int] = None  # null: one node's ranks
    # after an elastic shrink: keep the global batch (each rank takes more) or the per-rank batch
    elastic_keeps: ElasticKeeps = ElasticKeeps.global_batch


@dataclass
class DebugConf:
    fail_rank: Optional[int] = None  # fault injection: this rank fails ...
    fail_step: int = 0  # ... at this step
    # exception (a Python error) | kill (SIGKILL, no traceback) | start_segfault (SIGSEGV before
    # the ranks meet, fail_step unused: MPI's start failing as PMIx's does now and then)
    fail_mode: FailMode = FailMode.exception
    slow_rank: Optional[int] = (
        None  # this rank sleeps slow_s before every backward pass (a straggler; in a pipeline before each backward chunk) ...
    )
    slow_s: float = 0.0  # ... for this many seconds
    # every rank on this node is slow: its pre-flight GEMMs take SLOW_FACTOR x as long, and it
    # sleeps slow_s before every backward pass (a bad node, for tests)
    slow_node: Optional[str] = None
    hold_step: Optional[int] = None  # SLURM: on its first attempt every rank waits here until SIGUSR2


@dataclass
class StudyConf:
    """A scaling study: the same training at several scales, repeated (hpctrain study ...)."""

    kind: StudyKind = StudyKind.strong  # strong: fixed global batch | weak: fixed per-rank batch
    ranks: List[int] = field(default_factory=lambda: [1, 2])  # world sizes with cluster=local
    nodes: List[int] = field(default_factory=lambda: [1, 2])  # node counts with cluster=slurm
    repetitions: int = 3  # runs per scale, for a mean and a 95% confidence interval
    steps: int = 30  # optimizer steps of every run
    warmup_steps: int = 5  # excluded from timing
    global_batch: int = 64  # strong scaling: samples per step over all ranks
    batch_per_rank: int = 32  # weak scaling: samples per step per rank
    lr_scaling: LrScaling = LrScaling.none  # learning-rate rule for every run
    # each engine at every scale, interleaved (one series each on every plot and table);
    # null: only parallelism.engine
    engines: Optional[List[str]] = None
    # each parallelism (a conf/parallelism group: data, fsdp, hsdp, ...) at every scale, one series
    # each; `group/tpN` adds tensor parallelism of degree N (fsdp/tp2: 2-D), `group/ppN` N pipeline
    # stages (fsdp/pp2/tp2: 3-D); null: only the config's
    parallelisms: Optional[List[str]] = None
    # pipeline | hybrid: each micro-batch count at every scale, one series each (empty: the config's)
    microbatches: List[int] = field(default_factory=list)
    # SLURM: hold the largest point's nodes once and run every point as a job step inside that
    # allocation, one after another (smaller points on a subset of the same nodes): one wait in
    # the queue, and every speedup measured on the same nodes
    one_allocation: bool = False
    allreduce_bench: bool = True  # measure allreduce once per world size (local studies)
    allreduce_max_mb: int = 256  # largest allreduce message of that benchmark


@dataclass
class TuneConf:
    """hpctrain tune: short trials of the settings that matter for the config (analysis/tune.py)."""

    target_ranks: int = 0  # the world size to predict the best settings' throughput at (0: the config's)
    budget_min: float = 10.0  # no trial starts after this many minutes of tuning
    # the settings to search, by key (e.g. [parallelism.bucket_mb]); empty: every one the engine
    # and the parallelism offer
    keys: List[str] = field(default_factory=list)


@dataclass
class BenchConf:
    """Benchmarks that run as a workload, through the launcher's normal path like any run."""

    allreduce: bool = False  # every rank times the allreduces (hpctrain bench allreduce) instead of training
    min_bytes: int = 1024  # smallest allreduce message
    max_mb: int = 256  # largest allreduce message


@dataclass
class RunConf:
    name: str = "train"  # run name; letters, digits, '.', '_', '-'
    output_root: str = "outputs"  # run directories go to <output_root>/<date>/<time>-<name>
    dir: Optional[str] = None  # an explicit run directory (must not exist or be empty)
    # run/sweep/study directories to start after (--after): DIR[:ok] each job completes, DIR:any ends
    after: List[str] = field(default_factory=list)


@dataclass
class Config:
    model: ModelConf = field(default_factory=ModelConf)
    data: DataConf = field(default_factory=DataConf)
    precision: PrecisionConf = field(default_factory=PrecisionConf)
    parallelism: ParallelismConf = field(default_factory=ParallelismConf)
    optim: OptimConf = field(default_factory=OptimConf)
    cluster: Any = MISSING  # a ClusterConf subclass, chosen by the `cluster` group
    train: TrainConf = field(default_factory=TrainConf)
    debug: DebugConf = field(default_factory=DebugConf)
    loss: LossConf = field(default_factory=LossConf)
    code: CodeConf = field(default_factory=CodeConf)
    script: ScriptConf = field(default_factory=ScriptConf)
    study: Optional[StudyConf] = None  # set by the `study` group (hpctrain study strong|weak)
    bench: BenchConf = field(default_factory=BenchConf)
    tune: TuneConf = field(default_factory=TuneConf)
    run: RunConf = field(default_factory=RunConf)
    tracking: TrackingConf = field(default_factory=TrackingConf)  # the `tracking` group
    profile: ProfileConf = field(default_factory=ProfileConf)

    @property
    def user_code(self) -> bool:
        """Does this run import the user's code (a _target_ or a script)?"""
        return bool(
            self.script.path
            or self.model._target_
            or self.data._target_
            or self.loss._target_
            or self.optim._target_
        )


CLUSTER_SCHEMAS: dict[str, type[ClusterConf]] = {"local": LocalClusterConf, "slurm": SlurmClusterConf}


def register() -> None:
    """Register the schema in Hydra's ConfigStore (idempotent). Hydra is imported here, not with
    the schema: a rank reads its config.yaml without it (0.1 s of CPU it need not spend)."""
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    # stored once a process: each store converts the dataclasses again (a quarter of a compose's
    # CPU); a Hydra test's restored singletons, without them, get them back here
    groups = cs.repo.get("cluster", {})
    if "hpctrain_schema.yaml" in cs.repo and all(f"{n}_schema.yaml" in groups for n in CLUSTER_SCHEMAS):
        return
    cs.store(name="hpctrain_schema", node=Config)
    for name, node in CLUSTER_SCHEMAS.items():
        cs.store(group="cluster", name=f"{name}_schema", node=node)
