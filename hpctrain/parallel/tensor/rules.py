"""Tensor parallelism at plan time (parallelism.tp): its rules, each naming the key, the rule and
the fix, its line in the plan, and the fix it offers a model that does not fit. The ranks split
the model by the plan in plan.py (split.py)."""

from __future__ import annotations

from dataclasses import replace

from hpctrain.config.schema import Config
from hpctrain.engine.base import TensorParallel
from hpctrain.engine.registry import engines_with, lacks
from hpctrain.errors import Problem
from hpctrain.parallel.tensor.plan import (
    FUSED,
    SEAMS,
    STYLES,
    declared_tp_plan,
    fused_chunks,
    is_style,
    plan_for,
)


def tp_degree(cfg: Config) -> int:
    return max(int(cfg.parallelism.tp.degree), 1)


def tp_problems(cfg: Config, world: int) -> list[Problem]:
    tp = cfg.parallelism.tp
    if tp.degree < 1:
        return [
            Problem(
                "parallelism.tp.degree", f"must be >= 1 (got {tp.degree})", "e.g. parallelism.tp.degree=2"
            )
        ]
    if tp.degree == 1:
        return [
            Problem(
                f"parallelism.tp.{k}",
                "is a tensor-parallel setting; with tp.degree=1 it would do nothing",
                "set parallelism.tp.degree=2 or more, or drop it",
            )
            for k, on in (
                ("sequence_parallel", tp.sequence_parallel),
                ("plan", bool(tp.plan)),
                ("divide", bool(tp.divide)),
            )
            if on
        ]
    if world >= 1 and world % tp.degree:
        divisors = [d for d in range(1, world + 1) if world % d == 0]
        return [
            Problem(
                "parallelism.tp.degree",
                f"the world is data-parallel ranks x tensor-parallel degree: {world} ranks are not a "
                f"multiple of {tp.degree}",
                f"set parallelism.tp.degree to one of {', '.join(map(str, divisors))}",
            )
        ]
    return _engine(cfg) + _plan_problems(cfg) + _model_problems(cfg) + _idle(cfg)


def _engine(cfg: Config) -> list[Problem]:
    name = str(cfg.parallelism.engine)
    if not lacks(name, TensorParallel):
        return []
    able = engines_with(TensorParallel)
    return [
        Problem(
            "parallelism.engine",
            f"tensor parallelism splits layers over a torch.distributed device mesh; engine {name} cannot",
            f"set parallelism.engine to one of: {', '.join(able)}",
        )
    ]


def _plan_problems(cfg: Config) -> list[Problem]:
    tp, m = cfg.parallelism.tp, cfg.model
    bad = {str(k): str(v) for k, v in tp.plan.items() if not is_style(str(v))}
    if bad:
        return [
            Problem(
                f"parallelism.tp.plan.{k}",
                f"{v!r} is not a tensor-parallel style",
                f"use one of: {', '.join(STYLES)}, {FUSED}:K (K fused matrices, e.g. {FUSED}:3 for q/k/v)",
            )
            for k, v in bad.items()
        ]
    odd = [str(a) for a in tp.divide if "." not in str(a) or not str(a).rpartition(".")[2].isidentifier()]
    if odd:
        return [
            Problem(
                "parallelism.tp.divide",
                f"{odd} are not module.attribute names",
                "name each as the module (wildcards: *) and its attribute, e.g. h.*.attn.n_head",
            )
        ]
    if not plan_for(m, dict(tp.plan), tp.sequence_parallel):
        what = "your model" if m._target_ else f"model {m.name}"
        return [
            Problem(
                "parallelism.tp.plan",
                f"{what} has no tensor-parallel plan",
                "name its Linear layers, e.g. parallelism.tp.plan='{layers.*.w1: colwise, layers.*.w2: rowwise}'"
                + ("" if m._target_ else ", or use model=transformer or mlp"),
            )
        ]
    if tp.sequence_parallel and tp.plan and not any(str(v) in SEAMS for v in tp.plan.values()):
        return [
            Problem(
                "parallelism.tp.sequence_parallel",
                "your plan names no seams where the sequence is split and gathered",
                f"add the styles {', '.join(SEAMS)} to parallelism.tp.plan (docs: howto/tensor-parallel)",
            )
        ]
    return []


def _model_problems(cfg: Config) -> list[Problem]:
    """A built-in model's dimensions must split evenly over the group."""
    m, d, n, tp = cfg.model, cfg.data, tp_degree(cfg), cfg.parallelism.tp
    if m._target_ or tp.plan:
        return []  # the user's plan: checked where the model is built, on the ranks
    splits = {
        "transformer": [("model.heads", m.heads), ("data.vocab_size", d.vocab_size)],
        "mlp": [("model.width", m.width)],
    }
    p = [
        Problem(
            key,
            f"{value} does not split over {n} tensor-parallel ranks",
            f"use a multiple of {n}, or parallelism.tp.degree dividing {value}",
        )
        for key, value in splits.get(str(m.name), [])
        if value % n
    ]
    if tp.sequence_parallel and str(m.name) == "transformer" and d.seq_len % n:
        p.append(
            Problem(
                "data.seq_len",
                f"{d.seq_len} tokens do not split over {n} ranks (sequence parallelism)",
                f"use a multiple of {n}",
            )
        )
    if tp.sequence_parallel and not declared_tp_plan(m, sequence=True).keys() - declared_tp_plan(m).keys():
        p.append(
            Problem(
                "parallelism.tp.sequence_parallel",
                f"model {m.name} has no sequence to split",
                "drop parallelism.tp.sequence_parallel (it is for model=transformer)",
            )
        )
    return p


def _idle(cfg: Config) -> list[Problem]:
    """Settings tensor parallelism cannot honour yet."""
    par, p = cfg.parallelism, []
    if cfg.precision.name == "fp16":
        p.append(
            Problem(
                "precision.name",
                "fp16 needs a loss scale agreed across the tensor-parallel group, which is not made yet",
                "use precision=bf16 (no loss scaling needed) or fp32",
            )
        )
    if par.compression != "none":
        p.append(
            Problem(
                "parallelism.compression",
                "compresses DistributedDataParallel's gradient allreduce, which a tensor-parallel run does not use",
                "drop parallelism.compression",
            )
        )
    return p


def fused_unsharded(cfg: Config) -> list[Problem]:
    """colwise_fused's chunk-by-chunk split (DTensor's _StridedShard) cannot be sharded further:
    FSDP2 (torch 2.13) composes its shards with a plain column or row split only, and gathered
    such a weight wrongly (measured: 1.6 relative from one rank after 4 steps). Replicas of the
    split model are fine (parallelism=data with tp.degree below the world)."""
    return [
        Problem(
            f"parallelism.tp.plan.{k}",
            f"{v} cannot be sharded by FSDP as well (it composes only plain column or row splits with its own)",
            "use parallelism=data with parallelism.tp.degree (replicas of the split model), or give the "
            "fused Linear's matrices a Linear each",
        )
        for k, v in cfg.parallelism.tp.plan.items()
        if fused_chunks(str(v)) is not None
    ]


def tp_note(cfg: Config) -> str:
    tp = cfg.parallelism.tp
    plan = plan_for(cfg.model, dict(tp.plan), tp.sequence_parallel)
    shown = ", ".join(f"{k}: {v}" for k, v in list(plan.items())[:8]) + (" ..." if len(plan) > 8 else "")
    sp = "; sequence parallel between the split regions" if tp.sequence_parallel else ""
    return f"tensor parallel: groups of {tp_degree(cfg)} consecutive ranks split {shown}{sp}"


def wider(cfg: Config, world: int) -> list[tuple[str, Config]]:
    """A model that does not fit: each layer split over twice the ranks, where the world allows."""
    tp = cfg.parallelism.tp.degree
    if world % (2 * tp) or not (cfg.parallelism.tp.plan or declared_tp_plan(cfg.model)):
        return []
    more = replace(cfg.parallelism.tp, degree=2 * tp)
    return [(f"parallelism.tp.degree={2 * tp}", replace(cfg, parallelism=replace(cfg.parallelism, tp=more)))]
