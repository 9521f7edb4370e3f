"""The parallelism interface: one class per way of spreading a model over the ranks, registered by
name (registry.py) as engines and launchers are. A parallelism owns its rules, its layout (which
rank holds what, computed once at plan time and written to plan.json), its dry-run notes, its
account in the summary, and how the ranks build its trainer. Nothing outside its module asks for
its name: they ask it.

What plan time asks are class methods (no rank, no world); `build` runs on the ranks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from hpctrain.analysis.tune import Knob
from hpctrain.errors import Problem

if TYPE_CHECKING:
    from hpctrain.config.schema import Config
    from hpctrain.facts import HostFacts
    from hpctrain.records import Layout
    from hpctrain.train.checkpoint import Restored
    from hpctrain.train.setup import Setup
    from hpctrain.train.step import Trainer


class ParallelismKind:
    """A way of spreading the model over the ranks (data, pipeline, fsdp...): its rules, its layout,
    its notes and its account in the summary at plan time (class methods: no rank, no world), and
    on the ranks the trainer it builds (`build`). Registered by name in parallel/registry.py or by
    an entry point in the group `hpctrain.parallelisms` (examples/parallelism-plugin)."""

    #: set by the registry
    name: ClassVar[str] = ""
    #: the schema's groups of parallelism.* keys this parallelism reads (config/schema.py); another
    #: parallelism's, given to this one, are refused (they would do nothing)
    settings: ClassVar[tuple[type[Any], ...]] = ()
    #: the engine capability it needs (engine/base.py: Sharding, StageReplicas), or None
    needs: ClassVar[type[Any] | None] = None
    #: the ranks meet over torch.distributed whatever the engine (stages' point-to-point, meshes)
    torch_store: ClassVar[bool] = False
    #: it changes how hpctrain's own trainer holds the model: a user script cannot take it
    builtin_only: ClassVar[bool] = False
    #: its trainer compiles the model's blocks (train.compile) where they are built
    compiles: ClassVar[bool] = True
    #: a parallelism from another package: the dataclass of its own settings, given as
    #: parallelism.options.<key> (read with `read_options`); None: it takes none
    options: ClassVar[type[Any] | None] = None
    #: it takes the layout's named dimensions (parallel/dimensions.py: context parallelism), which
    #: divide its data-parallel ranks; a parallelism that does not refuses their settings
    takes_dims: ClassVar[bool] = False

    # --- plan time ---------------------------------------------------------------------------
    @classmethod
    def layout(cls, cfg: Config, world: int, ranks_per_node: int) -> Layout:
        """Which rank holds which part of the model (the degrees multiply to `world` once the
        rules hold; before that, the nearest layout that can be described)."""
        raise NotImplementedError

    @classmethod
    def problems(cls, cfg: Config, world: int, facts: HostFacts | None) -> list[Problem]:
        """This parallelism's rules (each names the key, the rule and the fix)."""
        return []

    @classmethod
    def notes(cls, cfg: Config, layout: Layout, ranks_per_node: int) -> list[str]:
        """The plan's (and --dry-run's) account of which rank holds what on which node."""
        return []

    @classmethod
    def about(cls, cfg: Config, layout: Layout, grads: dict[str, object]) -> dict[str, object]:
        """The summary's fields for this parallelism, given the engine's account of gradients; the
        parts its layout's dimensions declare are added by the rank (parallel/dimensions.py),
        before any of its own ("parts")."""
        return grads

    @classmethod
    def memory_probe(cls, cfg: Config) -> tuple[str, ...]:
        """The parallelism of the two-rank probe that measures a rank's own memory on this host
        (memory/fixed.py): what loads the same libraries and process groups as this one."""
        return (f"parallelism={cls.name}",)

    @classmethod
    def memory_fixes(cls, cfg: Config, world: int) -> list[tuple[str, Config]]:
        """Changes of this parallelism that lower a rank's memory, each as the override a user
        gives and the config it makes (memory/predict.py's check_fits tries each by the same prediction)."""
        return []

    @classmethod
    def batch_cuts(cls, cfg: Config) -> int:
        """Micro-batches one replica's batch is cut into per step."""
        return int(cfg.parallelism.backward_passes_per_step)

    @classmethod
    def engine_refusal(cls, engine: str, able: list[str]) -> Problem:
        """The problem when the engine lacks the capability this parallelism `needs`."""
        return Problem(
            "parallelism.engine",
            f"parallelism={cls.name} needs what engine {engine} cannot do",
            f"set parallelism.engine to one of: {', '.join(able)}",
        )

    @classmethod
    def study_overrides(cls, cfg: Config, world: int) -> tuple[str, ...]:
        """Overrides a scaling study adds at a point of `world` ranks (a pipeline grows its stages)."""
        return ()

    @classmethod
    def resume_problems(cls, cfg: Config, sharded_only: bool) -> list[Problem]:
        """Refusals of train.resume_from when it holds only sharded (.dcp) checkpoints."""
        return []

    @classmethod
    def tune_knobs(cls, cfg: Config, engine: list[Knob]) -> list[Knob]:
        """The settings `hpctrain tune` searches under this parallelism, given the engine's."""
        return engine

    @classmethod
    def read_options(cls, cfg: Config) -> Any:
        """parallelism.options as this parallelism's `options` dataclass; ConfigError naming the
        key for one it does not have or a value of the wrong type."""
        from hpctrain.config.values import structured_options

        if cls.options is None:
            raise TypeError(f"parallelism {cls.name} declares no options")  # a bug in the parallelism
        return structured_options(
            cls.options, cfg.parallelism.options, "parallelism.options", f"parallelism={cls.name}"
        )

    # --- on the ranks ------------------------------------------------------------------------
    @classmethod
    def build(cls, setup: Setup) -> tuple[Trainer, Restored]:
        """This rank's trainer, restored from the newest usable checkpoint if there is one."""
        raise NotImplementedError
