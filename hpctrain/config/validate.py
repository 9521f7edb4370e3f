"""Cross-field rules. Each problem names the key, the rule and the fix; all are reported at once."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from ..derived import replicas, resolve_batch, world_size
from ..errors import ConfigError, Problem
from ..facts import HostFacts
from ..parallel.rules import parallelism_problems
from ..workload.rules import workload_problems
from . import schema as S
from .schema import Config
from .values import value_problems

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["at_least", "resolve_batch", "validate", "world_size"]

OVERSUBSCRIBE_LIMIT = 8  # local ranks per core beyond which an explicit cluster.oversubscribe=true is needed
SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def validate(cfg: Config, facts: HostFacts | None = None) -> None:
    """Raise ConfigError listing every broken rule. `facts` enables checks against this host."""
    problems = _problems(cfg, facts)
    if problems:
        raise ConfigError(problems)


def validate_points(configs: Sequence[Config], labels: Sequence[str], facts: HostFacts | None) -> None:
    """Validate every point of a sweep or study; one ConfigError lists each broken rule once, with
    the points that break it, so nothing starts while any point is invalid."""
    where: dict[Problem, list[str]] = {}
    for cfg, label in zip(configs, labels):
        for p in _problems(cfg, facts):
            where.setdefault(p, []).append(label)
    if where:
        raise ConfigError([Problem(p.key, p.rule, p.fix, ", ".join(pts)) for p, pts in where.items()])


def at_least(key: str, value: float | None, low: float) -> list[Problem]:
    if value is None or value >= low:
        return []
    return [Problem(key, f"must be >= {low:g} (got {value:g})", f"set {key} to {low:g} or more")]


def _problems(cfg: Config, facts: HostFacts | None) -> list[Problem]:
    p: list[Problem] = []
    m, d, t, par, o = cfg.model, cfg.data, cfg.train, cfg.parallelism, cfg.optim
    # option sets (model.name, precision.name, ...) are enums in the schema: checked when loading
    for key, value, low in [
        ("model.width", m.width, 1),
        ("model.depth", m.depth, 1),
        ("model.heads", m.heads, 1),
        ("data.num_samples", d.num_samples, 1),
        ("data.channels", d.channels, 1),
        ("data.num_classes", d.num_classes, 2),
        ("data.seq_len", d.seq_len, 1),
        ("data.vocab_size", d.vocab_size, 2),
        ("data.num_workers", d.num_workers, 0),
        ("data.prefetch_factor", d.prefetch_factor, 1),
        ("precision.init_scale", cfg.precision.init_scale, 1),
        ("precision.growth_interval", cfg.precision.growth_interval, 1),
        ("parallelism.fusion_threshold_mb", par.fusion_threshold_mb, 0),
        ("parallelism.backward_passes_per_step", par.backward_passes_per_step, 1),
        ("optim.weight_decay", o.weight_decay, 0),
        ("optim.warmup_steps", o.warmup_steps, 0),
        ("optim.reference_batch", o.reference_batch, 1),
        ("train.steps", t.steps, 1),
        ("train.warmup_steps", t.warmup_steps, 0),
        ("train.log_interval", t.log_interval, 1),
        ("train.seed", t.seed, 0),
        ("debug.fail_step", cfg.debug.fail_step, 0),
    ]:
        p += at_least(key, value, low)
    p += _engine_problems(cfg)
    if par.cycle_time_ms is not None and par.cycle_time_ms <= 0:
        p.append(
            Problem(
                "parallelism.cycle_time_ms",
                f"must be > 0 (got {par.cycle_time_ms:g})",
                "set it to a positive number of milliseconds, or null for Horovod's default",
            )
        )
    if t.stall_timeout_s < 0 or 0 < t.stall_timeout_s < 5:
        p.append(
            Problem(
                "train.stall_timeout_s",
                f"must be 0 (off) or at least 5 s (got {t.stall_timeout_s:g}): the watchdog beats once a second",
                "e.g. train.stall_timeout_s=300",
            )
        )
    if o.lr <= 0:  # NaN and inf: value_problems
        p.append(Problem("optim.lr", f"must be > 0 (got {o.lr:g})", "set optim.lr to a positive number"))
    if o.momentum < 0 or o.momentum >= 1:
        p.append(
            Problem(
                "optim.momentum",
                f"must be in [0, 1) (got {o.momentum:g})",
                "set optim.momentum=0.9 (or 0 for plain SGD)",
            )
        )
    if len(o.betas) != 2 or not all(0 <= b < 1 for b in o.betas):
        p.append(
            Problem(
                "optim.betas",
                f"must be two numbers in [0, 1) (got {list(o.betas)})",
                "set optim.betas=[0.9,0.999]",
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
    if not SAFE_NAME.match(cfg.run.name):
        p.append(
            Problem(
                "run.name",
                f"{cfg.run.name!r} may hold only letters, digits, '.', '_', '-' (at most 64)",
                "choose a name like resnet50-bf16",
            )
        )
    p += value_problems(cfg)
    p += _cluster_problems(cfg)
    p += _batch_problems(cfg)
    p += _model_data_problems(cfg)
    p += workload_problems(cfg)
    p += parallelism_problems(cfg, world_size(cfg))
    if cfg.debug.fail_rank is not None:
        n = world_size(cfg)
        if n >= 1 and not 0 <= cfg.debug.fail_rank < n:
            p.append(
                Problem(
                    "debug.fail_rank",
                    f"must be a rank in [0, {n - 1}] (got {cfg.debug.fail_rank})",
                    "pick an existing rank, or set debug.fail_rank=null",
                )
            )
        if cfg.debug.fail_step >= t.steps >= 1:
            p.append(
                Problem(
                    "debug.fail_step",
                    f"is never reached ({cfg.debug.fail_step} >= train.steps={t.steps})",
                    f"set debug.fail_step below {t.steps}",
                )
            )
    p += _debug_problems(cfg, world_size(cfg))
    if facts is not None:
        p += _host_problems(cfg, facts)
    return p


def _engine_problems(cfg: Config) -> list[Problem]:
    """Settings of one engine given to the other would silently do nothing."""
    par = cfg.parallelism
    p = []
    if par.engine == "horovod":
        if par.compression == "bf16":
            p.append(
                Problem(
                    "parallelism.compression",
                    "bf16 compression is a DDP communication hook; Horovod compresses to fp16 only",
                    "use parallelism.compression=fp16, or parallelism.engine=ddp",
                )
            )
        defaults = S.ParallelismConf()
        for key in ("bucket_mb", "gradient_as_bucket_view", "static_graph"):
            if getattr(par, key) != getattr(defaults, key):
                p.append(
                    Problem(
                        f"parallelism.{key}",
                        "applies to engine=ddp only",
                        f"set parallelism.engine=ddp, or drop parallelism.{key} (Horovod: fusion_threshold_mb, cycle_time_ms)",
                    )
                )
    else:
        for key in ("fusion_threshold_mb", "cycle_time_ms"):
            if getattr(par, key) is not None:
                p.append(
                    Problem(
                        f"parallelism.{key}",
                        "applies to engine=horovod only",
                        "drop it for engine=ddp (DDP's own knob: parallelism.bucket_mb)",
                    )
                )
    if par.bucket_mb <= 0:
        p.append(
            Problem(
                "parallelism.bucket_mb",
                f"must be > 0 (got {par.bucket_mb:g})",
                "e.g. parallelism.bucket_mb=25",
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
    if dbg.slow_s < 0:
        p.append(Problem("debug.slow_s", f"must be >= 0 (got {dbg.slow_s:g})", "set debug.slow_s=0.1"))
    if dbg.hold_step is not None and not 0 < dbg.hold_step < steps:
        p.append(
            Problem(
                "debug.hold_step",
                f"must be a step in [1, {steps - 1}] (got {dbg.hold_step})",
                "hold mid-run, e.g. debug.hold_step=40 with train.steps=150",
            )
        )
    return p


def _cluster_problems(cfg: Config) -> list[Problem]:
    from ..launch.registry import launcher_class

    c = cfg.cluster
    p = launcher_class(c.name).problems(cfg)
    for k in c.env:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k):
            p.append(
                Problem(
                    f"cluster.env.{k}",
                    "is not a valid environment variable name",
                    "use letters, digits and '_', not starting with a digit",
                )
            )
    return p


def _batch_problems(cfg: Config) -> list[Problem]:
    t, acc = cfg.train, cfg.parallelism.backward_passes_per_step
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
    if world_size(cfg) < 1 or acc < 1:
        return []  # reported by the cluster / parallelism checks
    n = replicas(cfg)
    if t.global_batch is not None and t.global_batch % n:
        lo, hi = (t.global_batch // n) * n, (t.global_batch // n + 1) * n
        what = "the world size" if cfg.parallelism.name == "data" else "the number of replicas"
        return [
            Problem(
                "train.global_batch",
                f"{t.global_batch} is not divisible by {what} {n}",
                f"use a multiple of {n} (e.g. {lo or hi} or {hi}), or set train.batch_per_rank",
            )
        ]
    b = resolve_batch(cfg)
    if b.per_rank % acc:
        return [
            Problem(
                "parallelism.backward_passes_per_step",
                f"the per-rank batch {b.per_rank} is not divisible by {acc} backward passes",
                "choose backward_passes_per_step that divides the per-rank batch",
            )
        ]
    if (
        cfg.data._target_ is None
        and cfg.data.name in ("synthetic", "tokens")
        and b.global_ > cfg.data.num_samples
    ):
        return [
            Problem(
                "data.num_samples",
                f"{cfg.data.num_samples} samples cannot fill one global batch of {b.global_}",
                f"set data.num_samples >= {b.global_}, or use a smaller batch",
            )
        ]
    if cfg.data._target_ is None and cfg.data.name == "digits" and b.global_ > 1797:
        return [
            Problem(
                "train.batch_per_rank",
                f"the global batch {b.global_} exceeds the 1797 digits",
                "use a global batch of at most 1797",
            )
        ]
    return []


def _model_data_problems(cfg: Config) -> list[Problem]:
    m, d = cfg.model, cfg.data
    p: list[Problem] = []
    if m._target_ or d._target_ or cfg.script.path:
        return p  # the user's model or data: its own rules (workload/targets.py probes them)
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
        if not d.path:
            p.append(Problem("data.path", "is required for data=folder", "set data.path=/path/to/images"))
        elif not Path(d.path).is_dir():
            p.append(
                Problem(
                    "data.path",
                    f"{d.path} is not a directory",
                    "point data.path at a directory with one sub-directory of images per class",
                )
            )
        elif (n := class_count(d.path)) > d.num_classes:
            p.append(
                Problem(
                    "data.num_classes",
                    f"{d.path} has {n} class directories, but the model has {d.num_classes} outputs: "
                    f"labels {d.num_classes}..{n - 1} would be out of range",
                    f"set data.num_classes={n}",
                )
            )
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


def class_count(path: str) -> int:
    """Classes of an image folder: its sub-directories (as ImageFolder reads them)."""
    try:
        return sum(1 for c in Path(path).iterdir() if c.is_dir())
    except OSError:
        return 0


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
    dev = cfg.train.device
    if dev == "cuda" and not f.cuda_available:
        p.append(
            Problem(
                "train.device",
                "cuda was asked for, but torch sees no CUDA device here",
                "set train.device=auto (or cpu), or run on a GPU node",
            )
        )
    on_gpu = dev == "cuda" or (dev == "auto" and f.cuda_available)
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
