"""The dimensions of a layout by the name of their mesh dimension ("pp", "tp"), as parallelisms
are by theirs: what a dimension adds to a plan wherever it composes, asked of it, never of its
name. A dimension with a package of its own declares itself there; this table names it
("module:Class"), imported on first use, and another installed package registers its own in the
entry-point group "hpctrain.dimensions".

Asked today: the summary part a layout's dimension declares at plan time (its ranks' figures are
added to it when the summary is written), and a study's shorthand for its degree
(study.parallelisms=[fsdp/pp2/tp2])."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from hpctrain.registry import Registry

if TYPE_CHECKING:
    from hpctrain.config.schema import Config
    from hpctrain.records import Layout


class Dimension:
    name: ClassVar[str] = ""  # set by the registry: its mesh dimension, and its study shorthand
    degree_key: ClassVar[str] = ""  # the setting a study's shorthand sets (<name><N>: key=N)

    @classmethod
    def degree(cls, layout: Layout) -> int:
        """Ranks along this dimension in the layout (1: the layout does not have it)."""
        raise NotImplementedError

    @classmethod
    def declared_part(cls, cfg: Config, layout: Layout) -> tuple[str, dict[str, Any]] | None:
        """(its part's key, what the plan declares of it) for a layout that has the dimension."""
        return None


# name -> "module:Class"; imported on first use
DIMENSIONS: dict[str, str] = {
    "pp": "hpctrain.parallel.pipeline.dimension:Stages",
    "tp": "hpctrain.parallel.tensor:TensorDimension",
}
_REGISTRY: Registry[Dimension] = Registry(
    "dimension", DIMENSIONS, "hpctrain.dimensions", base="hpctrain.parallel.dimensions:Dimension"
)


def dimensions() -> dict[str, type[Dimension]]:
    """Every dimension by name: the built-in ones, then those other installed packages register."""
    out = {}
    for name in _REGISTRY.names():
        cls = _REGISTRY.get(name, "dimension")
        cls.name = name
        out[name] = cls
    return out


def declared_parts(cfg: Config, layout: Layout) -> dict[str, dict[str, Any]]:
    """The summary's parts (records/parts.py) the layout's dimensions declare; the ranks' figures
    are added to each when the summary is written."""
    out = {}
    for dim in dimensions().values():
        declared = dim.declared_part(cfg, layout) if dim.degree(layout) > 1 else None
        if declared is not None:
            out[declared[0]] = declared[1]
    return out
