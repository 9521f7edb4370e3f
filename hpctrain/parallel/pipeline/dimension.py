"""The pipeline's stages as a dimension of the layout (parallel/dimensions.py): "pp" on the mesh,
parallelism.stages, and the summary part its plan declares."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from hpctrain.parallel.dimensions import Dimension
from hpctrain.parallel.pipeline.figures import PipelineFigures

if TYPE_CHECKING:
    from hpctrain.config.schema import Config
    from hpctrain.records import Layout


class Stages(Dimension):
    degree_key: ClassVar[str] = "parallelism.stages"

    @classmethod
    def declared_part(cls, cfg: Config, layout: Layout) -> tuple[str, dict[str, Any]]:
        """The stages, micro-batches, schedule and model pieces per rank."""
        par = cfg.parallelism
        return PipelineFigures.KEY, {
            "stages": layout.stages,
            "microbatches": par.microbatches,
            "schedule": str(par.schedule),
            "pieces_per_rank": layout.virtual,
        }


DIMENSION = Stages
