"""What the launcher must provide for the chosen parallelism and engine together."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hpctrain.engine.registry import engine_class
from hpctrain.parallel.dimensions import needs_torch_store as dims_need_store
from hpctrain.parallel.registry import kind_of

if TYPE_CHECKING:
    from hpctrain.config.schema import Config


def needs_torch_store(cfg: Config) -> bool:
    """torch.distributed may run and needs MASTER_ADDR/MASTER_PORT: an engine that uses it, a
    user script, a parallelism whose ranks meet over it (a pipeline's stages talk point to point
    whatever the engine; a mesh's groups), or the allreduce benchmark (it times torch.distributed)."""
    return (
        bool(cfg.script.path)
        or cfg.bench.allreduce
        or kind_of(cfg).torch_store
        or dims_need_store(cfg)
        or engine_class(str(cfg.parallelism.engine)).needs_torch_store(cfg)
    )
