"""The dimensions of a layout by the name of their mesh dimension ("pp", "tp"), as parallelisms
are by theirs: what a dimension adds to a plan wherever it composes, asked of it, never of its
name. A dimension with a package of its own declares itself there; this table names it
("module:Class"), imported on first use, and another installed package registers its own in the
entry-point group "hpctrain.dimensions".

Asked: the summary part a layout's dimension declares at plan time (its ranks' figures are added
to it when the summary is written), a study's shorthand for its degree
(study.parallelisms=[fsdp/pp2/tp2]); and of a dimension the layout holds by name (Layout.dims,
`inner`: context parallelism), its degree from its settings, its rules, its line in the plan,
whether its ranks meet over torch.distributed, and its rank side (train/dims.py), which wraps the
model before the parallelism splits or shards it and takes part in every step."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, ClassVar

from hpctrain.dimension_packages import modules
from hpctrain.errors import Problem
from hpctrain.registry import Registry

if TYPE_CHECKING:
    from hpctrain.config.schema import Config
    from hpctrain.records import Layout
    from hpctrain.train.dims import RankDimension
    from hpctrain.train.setup import Build, Setup


class Dimension:
    name: ClassVar[str] = ""  # set by the registry: its mesh dimension, and its study shorthand
    degree_key: ClassVar[str] = ""  # the setting a study's shorthand sets (<name><N>: key=N)
    # held in Layout.dims by its name, between the shards and the tensor-parallel ranks; a
    # parallelism that takes such dimensions (ParallelismKind.takes_dims) divides its ranks by it
    inner: ClassVar[bool] = False
    torch_store: ClassVar[bool] = False  # its ranks meet over torch.distributed whatever the engine

    @classmethod
    def degree(cls, layout: Layout) -> int:
        """Ranks along this dimension in the layout: its mesh dimension's size (1: not on the mesh)."""
        return dict(layout.mesh_dims).get(cls.name, 1)

    @classmethod
    def configured(cls, cfg: Config) -> int:
        """An inner dimension's degree as its settings give it (1: off)."""
        return 1

    @classmethod
    def problems(cls, cfg: Config, world: int) -> list[Problem]:
        """An inner dimension's rules where it is on (each names the key, the rule and the fix)."""
        return []

    @classmethod
    def note(cls, cfg: Config, layout: Layout) -> str:
        """Its line in the plan (and --dry-run) where the layout has it."""
        return ""

    @classmethod
    def rank_side(cls, cfg: Config, layout: Layout, rank: int) -> RankDimension | None:
        """What `rank` does for the dimension (train/dims.py), where the layout has it; the memory
        trace asks it too (memory/trace.py), in a world of fake process groups."""
        return None

    @classmethod
    def declared_part(cls, cfg: Config, layout: Layout) -> tuple[str, dict[str, Any]] | None:
        """(its part's key, what the plan declares of it) for a layout that has the dimension."""
        return None


# name -> "module:Class"; imported on first use
DIMENSIONS: dict[str, str] = {
    **modules("dimension", "DIMENSION"),  # the packages' (dimension_packages.py) first, in its order
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


def inner_dims(cfg: Config) -> dict[str, int]:
    """The layout's named dimensions (Layout.dims) the settings turn on, in the registry's order."""
    return {n: c.configured(cfg) for n, c in dimensions().items() if c.inner and c.configured(cfg) > 1}


def inner_ranks(cfg: Config) -> int:
    """Ranks along the named dimensions together: what divides a parallelism's data-parallel ranks."""
    return math.prod(inner_dims(cfg).values())


def dimension_problems(cfg: Config, world: int, parallelism: str, takes: bool) -> list[Problem]:
    """The named dimensions' rules, where their settings turn them on (a degree below 1 too); a
    parallelism that takes none refuses them."""
    p = []
    for dim in (c for c in dimensions().values() if c.inner and c.configured(cfg) != 1):
        if takes or dim.configured(cfg) < 1:
            p += dim.problems(cfg, world)
        else:
            p.append(
                Problem(
                    dim.degree_key,
                    f"parallelism={parallelism} does not compose with this dimension",
                    f"use parallelism=data, fsdp or hsdp (parallelism.stages for a pipeline), or drop {dim.degree_key}",
                )
            )
    return p


def dimension_notes(cfg: Config, layout: Layout) -> list[str]:
    return [n for c in dimensions().values() if c.degree(layout) > 1 and (n := c.note(cfg, layout))]


def needs_torch_store(cfg: Config) -> bool:
    return any(c.torch_store for c in dimensions().values() if c.inner and c.configured(cfg) > 1)


def with_dimensions(build: Build, setup: Setup) -> Any:
    """The parallelism's `build` with the layout's dimensions' rank sides: each wraps the whole
    model first (a parallelism splits, shards or cuts what they wrapped), then takes part in
    every step of the trainer (Trainer.dims)."""
    dims = rank_sides(setup.cfg, setup.d.layout, setup.info.rank)
    for d in dims:
        d.wrap(setup.module)
    if dims and not any(p.is_meta for p in setup.module.parameters()):  # a deferred model: built-in
        from hpctrain.train.targets import one_sample

        sample = one_sample(setup.dataset, setup.common["device"])
        for d in dims:
            d.check(setup.module, setup.common["objective"], sample)
    setup.common["dims"] = dims
    return build(setup)


def rank_sides(cfg: Config, layout: Layout, rank: int) -> tuple[RankDimension, ...]:
    """The rank sides of the layout's dimensions, in the registry's order."""
    sides = [c.rank_side(cfg, layout, rank) for c in dimensions().values() if c.degree(layout) > 1]
    return tuple(d for d in sides if d is not None)
