"""Cross-field rules of the configuration itself. Each problem names the key, the rule and the fix;
all are reported at once. The axes above (launchers, engines, workloads, parallelism) add their
own rules; orchestrate/validate.py gathers them all before anything is written."""

from __future__ import annotations

import re

from hpctrain.config import schema as S
from hpctrain.config.derived import world_size
from hpctrain.config.folder import folder_problems
from hpctrain.config.objective_rules import objective_problems
from hpctrain.config.observe_rules import observe_problems
from hpctrain.config.preflight_rules import preflight_problems
from hpctrain.config.resume import resume_problems
from hpctrain.config.schema import Config
from hpctrain.config.values import value_problems
from hpctrain.errors import Problem
from hpctrain.facts import HostFacts

OVERSUBSCRIBE_LIMIT = 8  # local ranks per core beyond which an explicit cluster.oversubscribe=true is needed
SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def at_least(key: str, value: float | None, low: float) -> list[Problem]:
    if value is None or value >= low:
        return []
    return [Problem(key, f"must be >= {low:g} (got {value:g})", f"set {key} to {low:g} or more")]


RANGES = [  # (key, lowest value): option sets (model.name, ...) are enums, checked when loading
    ("model.width", 1),
    ("model.depth", 1),
    ("model.heads", 1),
    ("data.num_samples", 1),
    ("data.channels", 1),
    ("data.num_classes", 2),
    ("data.seq_len", 1),
    ("data.vocab_size", 2),
    ("data.num_workers", 0),
    ("data.prefetch_factor", 1),
    ("precision.init_scale", 1),
    ("precision.growth_interval", 1),
    ("parallelism.backward_passes_per_step", 1),
    ("optim.weight_decay", 0),
    ("optim.warmup_steps", 0),
    ("optim.reference_batch", 1),
    ("train.steps", 1),
    ("train.warmup_steps", 0),
    ("train.log_interval", 1),
    ("train.seed", 0),
    ("debug.fail_step", 0),
    ("train.max_restarts", 0),
]


def config_problems(cfg: Config, facts: HostFacts | None) -> list[Problem]:
    """Every rule of the configuration itself; `facts` adds the rules of the host the ranks run on."""
    p: list[Problem] = []
    for key, low in RANGES:
        section, name = key.split(".")
        p += at_least(key, getattr(getattr(cfg, section), name), low)
    p += _train_problems(cfg)
    mem = cfg.cluster.memory_per_rank_gib
    if mem is not None and mem <= 0:
        p.append(
            Problem(
                "cluster.memory_per_rank_gib",
                f"must be > 0 (got {mem:g})",
                "set the GiB each rank has, or null",
            )
        )
    p += resume_problems(cfg)
    p += objective_problems(cfg)
    if not SAFE_NAME.match(cfg.run.name):
        p.append(
            Problem(
                "run.name",
                f"{cfg.run.name!r} may hold only letters, digits, '.', '_', '-' (at most 64)",
                "choose a name like resnet50-bf16",
            )
        )
    p += value_problems(cfg)
    p += _env_problems(cfg)
    p += _batch_problems(cfg)
    p += _model_data_problems(cfg)
    p += _fail_problems(cfg, world_size(cfg))
    p += _debug_problems(cfg, world_size(cfg))
    p += observe_problems(cfg, world_size(cfg))
    if facts is not None:
        p += _host_problems(cfg, facts)
    return p


def _train_problems(cfg: Config) -> list[Problem]:
    t = cfg.train
    p = []
    for key, value in (
        ("train.stall_timeout_s", t.stall_timeout_s),
        ("script.stall_timeout_s", cfg.script.stall_timeout_s),
    ):
        if value < 0 or 0 < value < 5:
            p.append(
                Problem(
                    key,
                    f"must be 0 (off) or at least 5 s (got {value:g}): the watchdog beats once a second",
                    f"e.g. {key}=300",
                )
            )
    interval = getattr(cfg.cluster, "checkpoint_interval", 0)
    if interval < 0:
        p.append(
            Problem(
                "cluster.checkpoint_interval",
                f"must be >= 0 (got {interval})",
                "set it to a number of steps, or 0 for none",
            )
        )
    if t.warmup_steps >= t.steps >= 1:
        p.append(
            Problem(
                "train.warmup_steps",
                f"leaves no timed step ({t.warmup_steps} >= train.steps={t.steps})",
                f"set train.warmup_steps below {t.steps}, or raise train.steps",
            )
        )
    return p


def _fail_problems(cfg: Config, n: int) -> list[Problem]:
    """debug.fail_rank / fail_step: the injected failure must happen."""
    if cfg.debug.fail_rank is None:
        return []
    p = []
    steps = cfg.train.steps
    if n >= 1 and not 0 <= cfg.debug.fail_rank < n:
        p.append(
            Problem(
                "debug.fail_rank",
                f"must be a rank in [0, {n - 1}] (got {cfg.debug.fail_rank})",
                "pick an existing rank, or set debug.fail_rank=null",
            )
        )
    if cfg.debug.fail_step >= steps >= 1:
        p.append(
            Problem(
                "debug.fail_step",
                f"is never reached ({cfg.debug.fail_step} >= train.steps={steps})",
                f"set debug.fail_step below {steps}",
            )
        )
    return p


def _debug_problems(cfg: Config, n: int) -> list[Problem]:
    """The test hooks (debug.*): a straggler rank must exist, a hold step must be reached."""
    dbg, steps = cfg.debug, cfg.train.steps
    p = []
    if dbg.slow_rank is not None and n >= 1 and not 0 <= dbg.slow_rank < n:
        p.append(
            Problem(
                "debug.slow_rank",
                f"must be a rank in [0, {n - 1}] (got {dbg.slow_rank})",
                "pick an existing rank, or set debug.slow_rank=null",
            )
        )
    if dbg.slow_rank is not None and cfg.script.path:
        p.append(
            Problem(
                "debug.slow_rank",
                f"has no effect with script {cfg.script.path}: only the built-in trainer's steps sleep",
                "drop debug.slow_rank (and debug.slow_s)",
            )
        )
    if dbg.slow_s < 0:
        p.append(Problem("debug.slow_s", f"must be >= 0 (got {dbg.slow_s:g})", "set debug.slow_s=0.1"))
    elif (dbg.slow_rank is None and dbg.slow_node is None and dbg.slow_s > 0) or (
        dbg.slow_rank is not None and dbg.slow_s == 0
    ):  # one without the other slows nothing
        key = "debug.slow_s" if dbg.slow_rank is None else "debug.slow_rank"
        p.append(
            Problem(
                key,
                "slows nothing without the other of debug.slow_rank and debug.slow_s",
                "give both, e.g. debug.slow_rank=1 debug.slow_s=0.2",
            )
        )
    p += preflight_problems(cfg)
    if dbg.hold_step is not None and not 0 < dbg.hold_step < steps:
        p.append(
            Problem(
                "debug.hold_step",
                f"must be a step in [1, {steps - 1}] (got {dbg.hold_step})",
                "hold mid-run, e.g. debug.hold_step=40 with train.steps=150",
            )
        )
    return p


# who a rank is: each launcher sets these per rank (a value for every rank would be wrong for
# all but one, and the launcher's own would replace it anyway)
RANK_IDENTITY = frozenset(
    {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK", "SLURM_PROCID",
     "SLURM_NTASKS", "SLURM_LOCALID", "PMI_RANK", "PMI_SIZE", "HOROVOD_RANK", "HOROVOD_SIZE"}
)  # fmt: skip


def _env_problems(cfg: Config) -> list[Problem]:
    c = cfg.cluster
    p = []
    for k, v in c.env.items():
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k):
            p.append(
                Problem(
                    f"cluster.env.{k}",
                    "is not a valid environment variable name",
                    "use letters, digits and '_', not starting with a digit",
                )
            )
        elif k in RANK_IDENTITY or k.startswith("OMPI_COMM_WORLD_"):
            p.append(
                Problem(
                    f"cluster.env.{k}",
                    "says who a rank is, which the launcher sets for each rank",
                    "drop it (the world size is cluster.ranks, or nodes x ranks_per_node)",
                )
            )
        elif k == "MASTER_PORT" and not (str(v).isdigit() and 1 <= int(str(v)) <= 65535):
            p.append(
                Problem(
                    f"cluster.env.{k}",
                    f"{v!r} is not a TCP port",
                    "give a port number from 1024 to 65535 that is free on the first node, or drop it",
                )
            )
    return p


def _batch_problems(cfg: Config) -> list[Problem]:
    t = cfg.train
    if (t.batch_per_rank is None) == (t.global_batch is None):
        return [
            Problem(
                "train.batch_per_rank",
                "set exactly one of train.batch_per_rank and train.global_batch",
                "e.g. train.batch_per_rank=32 train.global_batch=null",
            )
        ]
    if t.batch_per_rank is not None and t.batch_per_rank < 1:
        return at_least("train.batch_per_rank", t.batch_per_rank, 1)
    if t.global_batch is not None and t.global_batch < 1:
        return at_least("train.global_batch", t.global_batch, 1)
    return []


def _model_data_problems(cfg: Config) -> list[Problem]:
    m, d = cfg.model, cfg.data
    p: list[Problem] = []
    if m._target_ or d._target_ or cfg.script.path:
        return p  # the user's model or data: its own rules (train/targets.py probes them)
    if m.name in S.TOKEN_MODELS and d.name in S.IMAGE_DATASETS:
        p.append(Problem("data.name", f"model {m.name} needs token data, not {d.name}", "set data=tokens"))
    if m.name in S.IMAGE_MODELS and d.name in S.TOKEN_DATASETS:
        p.append(
            Problem(
                "model.name",
                f"model {m.name} needs image data, not {d.name}",
                "set model=transformer, or data=synthetic/digits/folder",
            )
        )
    if m.tie_embeddings and m.name != "transformer":
        p.append(
            Problem(
                "model.tie_embeddings",
                f"ties a language model's head to its token embedding; model {m.name} has neither",
                "use model=transformer, or drop model.tie_embeddings",
            )
        )
    if m.name == "transformer" and m.width % max(m.heads, 1):
        p.append(
            Problem(
                "model.heads",
                f"model.width={m.width} is not divisible by {m.heads} heads",
                "choose heads that divide width (e.g. 4 for width 128)",
            )
        )
    if m.name == "cnn" and d.image_size < 4:
        p.append(
            Problem(
                "data.image_size",
                f"the cnn pools twice by 2 and needs >= 4 px (got {d.image_size})",
                "set data.image_size=4 or more",
            )
        )
    if d.name == "digits" and (d.channels, d.image_size, d.num_classes) != (1, 8, 10):
        p.append(
            Problem(
                "data.channels",
                "the digits are 1 channel, 8x8 px, 10 classes",
                "leave data.channels=1 data.image_size=8 data.num_classes=10 for data=digits",
            )
        )
    if d.name == "folder":
        p += folder_problems(d, world_size(cfg))
        if d.channels not in (1, 3, 4):
            p.append(
                Problem(
                    "data.channels",
                    f"images have 1, 3 or 4 channels (got {d.channels})",
                    "set data.channels=3 (RGB) or 1 (greyscale)",
                )
            )
    if cfg.data.prefetch_factor != 2 and cfg.data.num_workers == 0:
        p.append(
            Problem(
                "data.prefetch_factor",
                "only applies with data.num_workers > 0",
                "set data.num_workers=2 (or more), or leave prefetch_factor at 2",
            )
        )
    return p


def _host_problems(cfg: Config, f: HostFacts) -> list[Problem]:
    """Rules that depend on the machine the ranks run on (known for local launches)."""
    p: list[Problem] = []
    c = cfg.cluster
    if c.name == "local" and c.ranks > OVERSUBSCRIBE_LIMIT * f.cpu_count and c.oversubscribe is not True:
        p.append(
            Problem(
                "cluster.ranks",
                f"{c.ranks} ranks on {f.cpu_count} cores is over {OVERSUBSCRIBE_LIMIT} per core: a typo "
                "more likely than a plan (each rank is a full Python process with torch)",
                "lower cluster.ranks, or say cluster.oversubscribe=true to run it anyway",
            )
        )
    threads = c.threads_per_rank if c.name == "local" else None
    if threads and threads * c.ranks > OVERSUBSCRIBE_LIMIT * f.cpu_count and c.oversubscribe is not True:
        p.append(  # it becomes OMP_NUM_THREADS: 100,000 threads a rank would bring the host down
            Problem(
                "cluster.threads_per_rank",
                f"{threads} threads x {c.ranks} ranks on {f.cpu_count} cores is over "
                f"{OVERSUBSCRIBE_LIMIT} per core: a typo more likely than a plan",
                "lower it (null: the cores shared out among the ranks), or say cluster.oversubscribe=true",
            )
        )
    dev = cfg.train.device
    if dev == "cuda" and not f.cuda_available:
        p.append(
            Problem(
                "train.device",
                "cuda was asked for, but torch sees no CUDA device here",
                "set train.device=auto (or cpu), or run on a GPU node",
            )
        )
    on_gpu = f.on_gpus(dev)
    if c.name == "local" and on_gpu and f.cuda_devices and c.ranks > f.cuda_devices:
        # no "share" switch: NCCL refuses two ranks on one GPU ("Duplicate GPU detected"), and every
        # engine reduces CUDA tensors with NCCL
        p.append(
            Problem(
                "cluster.ranks",
                f"{c.ranks} ranks on {f.cuda_devices} GPU(s): each local rank needs a GPU of its own "
                "(NCCL refuses two ranks on one GPU)",
                f"set cluster.ranks={f.cuda_devices}, or train.device=cpu to run {c.ranks} ranks on the CPUs",
            )
        )
    prec = cfg.precision.name
    if on_gpu and prec == "bf16" and not f.cuda_bf16:
        p.append(
            Problem(
                "precision.name",
                "bf16 needs a GPU with bfloat16 support (Ampere or newer)",
                "use precision=fp16 on this GPU",
            )
        )
    if not on_gpu and prec == "fp16" and not f.cpu_fp16_autocast:
        p.append(
            Problem(
                "precision.name",
                "this torch build cannot autocast to fp16 on the CPU",
                "use precision=bf16 or fp32 on CPU, or run on a GPU",
            )
        )
    if not on_gpu and prec == "bf16" and not f.cpu_bf16_autocast:
        p.append(
            Problem(
                "precision.name",
                "this torch build cannot autocast to bf16 on the CPU",
                "use precision=fp32 on this machine",
            )
        )
    return p
