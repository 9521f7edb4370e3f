"""Scaling studies expanded into runs. Pure: the points of a study, their overrides and run
directory names; running them is study_run.py's job."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from hpctrain.config.schema import Config, PipelineSettings, StudyConf
from hpctrain.engine.registry import engine_names, unknown_engine
from hpctrain.errors import ConfigError, Problem
from hpctrain.parallel.dimensions import dimensions
from hpctrain.parallel.registry import kind_of, parallelism_class, parallelism_names


@dataclass(frozen=True)
class StudyPoint:
    scale: int  # ranks (local) or nodes (SLURM)
    rep: int
    overrides: tuple[str, ...]  # added after the user's own overrides
    engine: str | None = None  # set when the study compares engines (study.engines)
    microbatches: int | None = None  # set when it compares micro-batch counts (study.microbatches)
    parallelism: str | None = None  # set when it compares parallelisms (study.parallelisms)

    @property
    def name(self) -> str:
        par = f"{self.parallelism.replace('/', '-')}-" if self.parallelism else ""
        engine = f"{self.engine}-" if self.engine else ""
        m = f"m{self.microbatches}-" if self.microbatches else ""
        return f"{par}{engine}{m}n{self.scale}-r{self.rep}"


def study_problems(s: StudyConf, scale: str) -> list[Problem]:
    """`scale`: what the launcher scales, `ranks` (local) or `nodes` (SLURM)."""
    p = []
    scales = getattr(s, scale)
    key = f"study.{scale}"
    if not scales or any(n < 1 for n in scales) or len(set(scales)) != len(scales):
        p.append(Problem(key, f"{list(scales)} must be distinct positive counts", f"e.g. {key}=[1,2,4]"))
    if s.repetitions < 1:
        p.append(Problem("study.repetitions", "must be >= 1", "set study.repetitions=3"))
    if s.warmup_steps >= s.steps:
        p.append(Problem("study.warmup_steps", "leaves no timed step", "set it below study.steps"))
    if len(set(s.microbatches)) != len(s.microbatches) or any(m < 1 for m in s.microbatches):
        p.append(
            Problem(
                "study.microbatches",
                f"{list(s.microbatches)} must be distinct positive counts",
                "e.g. study.microbatches=[2,4,8]",
            )
        )
    engines = s.engines or []
    known = engine_names()
    p += [unknown_engine(f"study.engines[{i}]", str(e)) for i, e in enumerate(engines) if e not in known]
    if s.engines is not None and not s.engines:
        p.append(
            Problem(
                "study.engines",
                "[] compares no engine",
                "list the engines to compare (study.engines=[horovod,ddp]), or drop it to study "
                "parallelism.engine alone",
            )
        )
    p += _parallelisms_problems(s)
    if len(set(engines)) != len(engines):
        p.append(
            Problem(
                "study.engines",
                f"{[str(e) for e in engines]} names an engine twice",
                "e.g. study.engines=[horovod,ddp]",
            )
        )
    return p


def expand_study(cfg: Config) -> list[StudyPoint]:
    """One point per scale, repetition and compared engine, smallest scale first."""
    s = cfg.study
    if s is None:
        raise ConfigError.one("study", "no study selected", "use hpctrain study strong|weak")
    scale = cfg.cluster.study_scale
    problems = study_problems(s, scale)
    if s.one_allocation and not cfg.cluster.holds_allocations:
        problems.append(
            Problem(
                "study.one_allocation",
                f"holds one scheduler allocation for every point; cluster={cfg.cluster.name} starts each "
                "run at once on nodes it does not hold",
                "drop study.one_allocation, or use cluster=slurm",
            )
        )
    if s.engines and cfg.script.path:
        problems.append(
            Problem(
                "study.engines",
                "a script chooses its own engine; hpctrain cannot switch it",
                "drop study.engines, or pass the engine to the script in a sweep of script.args",
            )
        )
    kind = kind_of(cfg)
    compared = [split_layout(str(x))[0] for x in s.parallelisms or []]
    known = parallelism_names()
    kinds = [kind, *(parallelism_class(g) for g in compared if g in known)]
    if s.microbatches and not any(PipelineSettings in k.settings for k in kinds):
        problems.append(
            Problem(
                "study.microbatches",
                "micro-batches are a pipeline setting",
                "use parallelism=pipeline or hybrid, or drop study.microbatches",
            )
        )
    if problems:
        raise ConfigError(problems)
    if s.kind == "strong":
        batch = ("train.batch_per_rank=null", f"train.global_batch={s.global_batch}")
    else:
        batch = (f"train.batch_per_rank={s.batch_per_rank}", "train.global_batch=null")
    common = (
        f"train.steps={s.steps}",
        f"train.warmup_steps={s.warmup_steps}",
        f"optim.lr_scaling={s.lr_scaling}",
        *batch,
    )
    # engines innermost: the runs they are compared on are taken close together in time, so a
    # noisy neighbour shifts both series alike
    engines: list[str | None] = [str(e) for e in s.engines or []] or [None]
    ms: list[int | None] = list(s.microbatches) or [None]
    pars: list[str | None] = [str(x) for x in s.parallelisms or []] or [None]
    return [
        StudyPoint(
            n,
            r,
            (
                *(layout_overrides(q) if q else []),  # the group first: the keys below override it
                f"cluster.{scale}={n}",
                *common,
                *kind.study_overrides(cfg, _world(cfg, scale, n)),  # a pipeline's stages grow
                *([f"parallelism.microbatches={m}"] if m else []),
                *([f"parallelism.engine={e}"] if e else []),
            ),
            e,
            m,
            q,
        )
        for n in sorted(getattr(s, scale))
        for r in range(s.repetitions)
        for m in ms
        for q in pars
        for e in engines
    ]


def _world(cfg: Config, scale: str, n: int) -> int:
    """The world size at `cluster.<scale>=n`, as the cluster config counts it."""
    return int(dataclasses.replace(cfg.cluster, **{scale: n}).world_size)


def split_layout(entry: str) -> tuple[str, dict[str, int]]:
    """A study.parallelisms entry: a parallelism group, then optionally its pipeline stages and
    tensor-parallel degree (`fsdp/tp2`: 2-D; `fsdp/pp2/tp2`: 3-D, parallelism=fsdp with
    parallelism.stages=2 and parallelism.tp.degree=2); (group, {"pp": N, "tp": N} as given). A
    suffix that is not pp<N> or tp<N>, or one given twice, is a degree of 0."""
    group, *suffixes = entry.split("/")
    degrees: dict[str, int] = {}
    shorthand = re.compile(f"({'|'.join(map(re.escape, dimensions()))})([0-9]+)")  # pp2, tp2
    for suffix in suffixes:
        m = shorthand.fullmatch(suffix)
        kind = m.group(1) if m else suffix
        degrees[kind] = int(m.group(2)) if m and kind not in degrees else 0
    return group, degrees


def layout_overrides(entry: str) -> list[str]:
    group, degrees = split_layout(entry)
    keys = {name: dim.degree_key for name, dim in dimensions().items()}
    return [f"parallelism={group}", *(f"{keys[k]}={n}" for k, n in degrees.items() if k in keys and n > 1)]


def _parallelisms_problems(s: StudyConf) -> list[Problem]:
    given = [str(x) for x in s.parallelisms] if s.parallelisms is not None else None
    if given is None:
        return []
    names = parallelism_names()
    parsed = [(i, x, *split_layout(x)) for i, x in enumerate(given)]
    p = [
        Problem(f"study.parallelisms[{i}]", f"no parallelism named {x!r}", f"use one of: {', '.join(names)}")
        for i, x, group, _ in parsed
        if group not in names
    ]
    p += [
        Problem(
            f"study.parallelisms[{i}]",
            f"{x!r}: what follows '/' must be pipeline stages or a tensor-parallel degree of at least "
            "2, each once",
            f"e.g. {group}/tp2 (parallelism.tp.degree=2), {group}/pp2/tp2 (and parallelism.stages=2), "
            f"or {group} alone",
        )
        for i, x, group, degrees in parsed
        if group in names and any(n < 2 for n in degrees.values())  # split_layout: 0 for a non-dimension
    ]
    if not given or len(set(given)) != len(given):
        p.append(
            Problem(
                "study.parallelisms",
                f"{given} must name distinct parallelisms",
                "e.g. study.parallelisms=[data,fsdp,fsdp/tp2], or drop it to study the config's "
                "parallelism alone",
            )
        )
    return p
