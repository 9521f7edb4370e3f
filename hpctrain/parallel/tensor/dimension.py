"""Tensor parallelism as a dimension of the layout (parallel/dimensions.py): "tp" on the mesh,
innermost (consecutive ranks), parallelism.tp.degree. It splits each layer over its ranks: data
(one replica: pure TP), fsdp/hsdp (2-D: TP x sharding) and the pipelines (each stage split) take
it through TpHolder in their settings and ask it here, never by name."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from hpctrain.parallel.dimensions import Dimension
from hpctrain.parallel.tensor.figures import KEY
from hpctrain.parallel.tensor.plan import is_style, plan_for
from hpctrain.parallel.tensor.rules import fused_unsharded, tp_degree, tp_note, tp_problems, wider

if TYPE_CHECKING:
    from hpctrain.config.schema import Config
    from hpctrain.errors import Problem
    from hpctrain.records import Layout
    from hpctrain.train.dims import LayerSplit


class Tensor(Dimension):
    degree_key: ClassVar[str] = "parallelism.tp.degree"
    splits_layers: ClassVar[bool] = True

    @classmethod
    def configured(cls, cfg: Config) -> int:
        return tp_degree(cfg)

    @classmethod
    def problems(cls, cfg: Config, world: int) -> list[Problem]:
        return tp_problems(cfg, world)

    @classmethod
    def shard_problems(cls, cfg: Config) -> list[Problem]:
        return fused_unsharded(cfg)

    @classmethod
    def note(cls, cfg: Config, layout: Layout) -> str:
        return tp_note(cfg)

    @classmethod
    def declared_part(cls, cfg: Config, layout: Layout) -> tuple[str, dict[str, Any]]:
        return KEY, {"degree": layout.tp}

    @classmethod
    def memory_fixes(cls, cfg: Config, world: int) -> list[tuple[str, Config]]:
        return wider(cfg, world)

    @classmethod
    def checks_model(cls, cfg: Config) -> bool:
        tp = cfg.parallelism.tp
        return (
            bool(tp.plan or tp.divide) and tp.degree >= 2 and all(is_style(str(v)) for v in tp.plan.values())
        )

    @classmethod
    def model_problems(cls, cfg: Config, model: Any) -> list[Problem]:
        """A plan that matches nothing, splits a module it cannot, a dimension that does not divide
        over the degree, a divide attribute that is not a count the degree divides, or a tied
        parameter split two ways (on the meta model)."""
        from hpctrain.errors import Problem
        from hpctrain.parallel.tensor.split import TensorParallelError, check_plan

        tp = cfg.parallelism.tp
        plan = plan_for(cfg.model, dict(tp.plan), tp.sequence_parallel)
        try:
            check_plan(model, plan, int(tp.degree), [str(a) for a in tp.divide])
        except TensorParallelError as e:
            key, _, why = str(e).partition(": ")
            fix = (
                "name each module (wildcards: *) and the whole-number attribute its forward reads, e.g. h.*.attn.n_head"
                if key == "parallelism.tp.divide"
                else "name Linear or Embedding modules as model.named_modules() does (wildcards: *)"
            )
            return [Problem(key, why, fix)]
        return []

    @classmethod
    def layer_split(cls, cfg: Config) -> LayerSplit:
        from hpctrain.parallel.tensor.side import TensorSplit

        return TensorSplit(cfg)


DIMENSION = Tensor
