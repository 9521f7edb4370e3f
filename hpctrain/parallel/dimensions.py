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
    from hpctrain.train.dims import LayerSplit, RankDimension
    from hpctrain.train.setup import Build, Setup


class Dimension:
    name: ClassVar[str] = ""  # set by the registry: its mesh dimension, and its study shorthand
    degree_key: ClassVar[str] = ""  # the setting a study's shorthand sets (<name><N>: key=N)
    # held in Layout.dims by its name, between the shards and the tensor-parallel ranks; a
    # parallelism that takes such dimensions (ParallelismKind.takes_dims) divides its ranks by it
    inner: ClassVar[bool] = False
    torch_store: ClassVar[bool] = False  # its ranks meet over torch.distributed whatever the engine
    # it splits each layer over its ranks (tensor parallelism): the parallelisms that take it
    # (TpHolder in their settings) divide their ranks by it and ask its rules, note and rank side
    splits_layers: ClassVar[bool] = False

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

    @classmethod
    def shard_problems(cls, cfg: Config) -> list[Problem]:
        """What of it cannot be sharded as well (fsdp/hsdp over more than one shard)."""
        return []

    @classmethod
    def memory_fixes(cls, cfg: Config, world: int) -> list[tuple[str, Config]]:
        """(override, config) it offers a model that does not fit in memory."""
        return []

    @classmethod
    def checks_model(cls, cfg: Config) -> bool:
        """Whether its settings name the model's modules (checked on the meta model)."""
        return False

    @classmethod
    def model_problems(cls, cfg: Config, model: Any) -> list[Problem]:
        """Its settings checked against the model built on the meta device."""
        return []

    @classmethod
    def layer_split(cls, cfg: Config) -> LayerSplit | None:
        """A dimension that splits layers: what a rank does for it (train/dims.py)."""
        return None


# name -> "module:Class"; imported on first use
DIMENSIONS: dict[str, str] = {
    **modules("dimension", "DIMENSION"),  # the packages' (dimension_packages.py), in its order
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
    """The named dimensions' lines of the plan (a layer split's the parallelism places: split_notes)."""
    return [
        n
        for c in dimensions().values()
        if not c.splits_layers and c.degree(layout) > 1 and (n := c.note(cfg, layout))
    ]


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
    setup.layer_split = layer_split(setup.cfg, setup.d.layout)
    return build(setup)


def rank_sides(cfg: Config, layout: Layout, rank: int) -> tuple[RankDimension, ...]:
    """The rank sides of the layout's dimensions, in the registry's order."""
    sides = [c.rank_side(cfg, layout, rank) for c in dimensions().values() if c.degree(layout) > 1]
    return tuple(d for d in sides if d is not None)


# --- the dimensions that split each layer (tensor parallelism), asked by the parallelisms that
# take them (data, fsdp/hsdp, the pipelines), the model's rules and the memory prediction
def _splitting() -> list[type[Dimension]]:
    return [c for c in dimensions().values() if c.splits_layers]


def split_degree(cfg: Config) -> int:
    """Ranks each layer is split over, as the settings give them (1: none)."""
    return math.prod(c.configured(cfg) for c in _splitting())


def split_problems(cfg: Config, world: int) -> list[Problem]:
    return [p for c in _splitting() for p in c.problems(cfg, world)]


def split_shard_problems(cfg: Config) -> list[Problem]:
    """What of a layer split cannot be sharded as well."""
    return [p for c in _splitting() if c.configured(cfg) > 1 for p in c.shard_problems(cfg)]


def split_notes(cfg: Config, layout: Layout) -> list[str]:
    return [n for c in _splitting() if c.degree(layout) > 1 and (n := c.note(cfg, layout))]


def layer_split(cfg: Config, layout: Layout) -> LayerSplit | None:
    """What the ranks do for the layout's layer split (None: the layout splits no layer)."""
    return next((s for c in _splitting() if c.degree(layout) > 1 and (s := c.layer_split(cfg))), None)


def memory_fixes(cfg: Config, world: int) -> list[tuple[str, Config]]:
    return [f for c in dimensions().values() for f in c.memory_fixes(cfg, world)]


def checks_model(cfg: Config) -> bool:
    return any(c.checks_model(cfg) for c in dimensions().values())


def model_problems(cfg: Config, model: Any) -> list[Problem]:
    return [p for c in dimensions().values() if c.checks_model(cfg) for p in c.model_problems(cfg, model)]
