"""Context parallelism as a dimension of the layout (parallel/dimensions.py): "cp" on the mesh,
between the shards and the tensor-parallel ranks (TorchTitan's order), parallelism.cp.degree."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from hpctrain.parallel.context.figures import KEY
from hpctrain.parallel.context.rules import context_problems, split_at
from hpctrain.parallel.context.settings import cp_settings
from hpctrain.parallel.dimensions import Dimension

if TYPE_CHECKING:
    from hpctrain.config.schema import Config
    from hpctrain.errors import Problem
    from hpctrain.records import Layout
    from hpctrain.train.dims import RankDimension


class Context(Dimension):
    degree_key: ClassVar[str] = "parallelism.cp.degree"
    inner: ClassVar[bool] = True
    torch_store: ClassVar[bool] = True  # its exchanges go over torch.distributed whatever the engine

    @classmethod
    def configured(cls, cfg: Config) -> int:
        return int(cp_settings(cfg).degree)

    @classmethod
    def problems(cls, cfg: Config, world: int) -> list[Problem]:
        return context_problems(cfg, world)

    @classmethod
    def note(cls, cfg: Config, layout: Layout) -> str:
        n = layout.dims["cp"]
        return (
            f"context parallel: each sample's sequence split over {n} ranks at {split_at(cfg)} (zig-zag: "
            f"rank i holds chunks i and {2 * n - 1}-i of {2 * n}); attention gathers K/V (CPU) or rings them (CUDA)"
        )

    @classmethod
    def declared_part(cls, cfg: Config, layout: Layout) -> tuple[str, dict[str, Any]]:
        return KEY, {"degree": layout.dims["cp"], "split_at": split_at(cfg)}

    @classmethod
    def rank_side(cls, cfg: Config, layout: Layout, rank: int) -> RankDimension:
        from hpctrain.parallel.context.side import ContextSide

        return ContextSide(cfg, layout, rank)


DIMENSION = Context
