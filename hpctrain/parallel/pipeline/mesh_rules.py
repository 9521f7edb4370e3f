"""Config rules of a pipeline whose stages are sharded (parallelism=fsdp | hsdp with
parallelism.stages) or split by tensor parallelism (parallelism.tp.degree with a pipeline), or
both (3-D, TorchTitan's PP x FSDP x TP): the layout's degrees over one mesh. Its stages are cut
along the model's chain of modules (config/split.py:declared_chain), not traced: FSDP and tensor
parallelism take real modules. Pure: nothing is built."""

from __future__ import annotations

from hpctrain.config.layout import SCHEDULES
from hpctrain.config.schema import Config
from hpctrain.config.split import declared_chain
from hpctrain.errors import Problem


def mesh_stages(cfg: Config, sharded: bool) -> bool:
    """Does this config's pipeline hold sharded or tensor-parallel stages? `sharded`: the
    parallelism shards (fsdp/hsdp), whose stages are then always FSDP modules."""
    par = cfg.parallelism
    return par.stages > 1 and (sharded or par.tp.degree > 1)


def mesh_stage_problems(cfg: Config, sharded: bool) -> list[Problem]:
    """The rules such a pipeline adds to the pipeline's own (rules.py)."""
    if not mesh_stages(cfg, sharded):
        return []
    par, m = cfg.parallelism, cfg.model
    what = " and ".join(w for w, on in (("sharded", sharded), ("tensor-parallel", par.tp.degree > 1)) if on)
    undo = "drop parallelism.stages" if sharded else "drop parallelism.tp.degree"
    p = []
    if not declared_chain(m):
        model = "your model" if m._target_ else f"model {m.name}"
        p.append(
            Problem(
                "parallelism.stages",
                f"a pipeline of {what} stages is cut along a chain of modules each run on the one "
                f"before's output; {model} does not declare one",
                f"use model=transformer or model=mlp, or {undo}",
            )
        )
    schedule = str(par.schedule)
    if SCHEDULES[schedule].split_backward:
        p.append(
            Problem(
                "parallelism.schedule",
                f"{schedule} splits the backward into input and weight gradients, which {what} stages "
                "do not take",
                "use schedule=gpipe, 1f1b or interleaved_1f1b",
            )
        )
    return p


def whole_checkpoints_refused(cfg: Config, sharded_only: bool) -> list[Problem]:
    """Such a pipeline's stages load sharded checkpoints (by parameter name) only: the refusal of
    a train.resume_from that holds whole-model ones."""
    if sharded_only:
        return []
    return [
        Problem(
            "train.resume_from",
            f"{cfg.train.resume_from} holds whole-model checkpoints (.pt), which sharded or "
            "tensor-parallel pipeline stages do not read (they load sharded ones, by parameter name)",
            "resume it with parallelism=data, pipeline or hybrid, or from a run with sharded checkpoints "
            "(fsdp, TP)",
        )
    ]
