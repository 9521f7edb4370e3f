"""The parallelism axis: how the model is spread over the ranks. Each parallelism is a class
(base.ParallelismKind) in its package, registered by name in registry.py: data (every rank holds
the whole model), pipeline (stages across ranks), hybrid (stages x data-parallel replicas), fsdp
(every rank holds a shard) and hsdp (shard groups x replicas). Its layout (records.Layout: which
rank holds what) is computed once at plan time and read by the ranks from plan.json.

Each concept owns its whole life in a package: data/, sharded/ (fsdp, hsdp), and the dimensions
pipeline/ (its plan-time rules, its parallelisms, its rank side: the cut, the schedule, the step
and the link between stages), tensor/ and context/, registered by one line each
(hpctrain/dimension_packages.py). The parallelisms ask the dimensions through dimensions.py, never
by name; where fsdp takes a pipeline's stages on one device mesh, it asks mesh.py, the shared mesh.
The trainer over a device mesh that they share is train/mesh_trainer.py (with
shard_checkpoint.py: sharded checkpoints)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hpctrain.config.schema import Config
    from hpctrain.parallel.registry import derive, kind_of, layout_of, resolve_batch
    from hpctrain.records import Layout

__all__ = ["derive", "kind_of", "layout_of", "parallel_notes", "resolve_batch"]


def __getattr__(name: str) -> Any:
    """The registry's functions, imported on first use: reading a record imports a dimension's
    figures (records/parts.py) without the configuration this package's planning needs (PEP 562)."""
    if name in ("derive", "kind_of", "layout_of", "resolve_batch"):
        from hpctrain.parallel import registry

        return getattr(registry, name)
    raise AttributeError(f"module 'hpctrain.parallel' has no attribute {name!r}")


def parallel_notes(cfg: Config, layout: Layout, ranks_per_node: int) -> list[str]:
    """The plan's (and --dry-run's) account of which rank holds what on which node."""
    from hpctrain.parallel.dimensions import dimension_notes
    from hpctrain.parallel.registry import kind_of

    return kind_of(cfg).notes(cfg, layout, ranks_per_node) + dimension_notes(cfg, layout)
