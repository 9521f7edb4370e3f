"""Sharded data parallelism on the ranks (parallelism=fsdp | hsdp): the model is sharded by the
engine (FSDP2's fully_shard over the mesh config/layout.py describes), the optimizer is built on
the shards, and checkpoints are sharded (shard_checkpoint.py). A step is the data-parallel one:
each rank a slice of the global batch; the engine's micro_batch holds the gradient sync back until
the last micro-batch of an accumulation."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch import nn

from hpctrain.config.derived import Derived
from hpctrain.config.layout import shard_mesh
from hpctrain.config.schema import Config
from hpctrain.engine.base import Sharding
from hpctrain.engine.world import CommError, RankInfo
from hpctrain.parallel.split import shard_units
from hpctrain.train import checkpoint, shard_checkpoint
from hpctrain.train.data import GlobalBatchSampler, build_loader
from hpctrain.train.step import DataParallelTrainer

if TYPE_CHECKING:
    from hpctrain.engine.base import Engine


@dataclass(kw_only=True)
class ShardedTrainer(DataParallelTrainer):
    """Every rank holds a shard of the model (model and weights: the sharded module)."""

    def whole_model_state(self, engine: Engine) -> dict[str, Any]:
        """Gathered into rank 0's memory (collective; the others get an empty dict)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_model_state_dict(self.model, options=opts)

    def save_checkpoint(self, run_dir: Path, step: int, engine: Engine, master: bool) -> Path | None:
        return shard_checkpoint.save(run_dir, step, self.model, self.optimizer, master, engine.barrier)

    def grad_tensors(self) -> int:
        """FSDP's units: each all-gathers its parameters and reduce-scatters its gradients as one."""
        from torch.distributed.fsdp import FSDPModule

        return sum(1 for m in self.model.modules() if isinstance(m, FSDPModule))


def sharded_trainer(
    cfg: Config,
    engine: Engine,
    info: RankInfo,
    d: Derived,
    run_dir: Path,
    module: nn.Module,
    make_optimizer: Callable[[nn.Module], Any],
    sampler: Callable[..., GlobalBatchSampler],
    dataset: Any,
    common: Any,
) -> tuple[ShardedTrainer, checkpoint.Restored]:
    if not isinstance(engine, Sharding):
        raise CommError(f"engine {engine.name} cannot shard a model")
    mesh = shard_mesh(cfg, d.world_size, info.local_size)
    units = shard_units(cfg.model, list(cfg.parallelism.shard.modules))
    model = engine.shard(cfg, module, mesh.replicate, mesh.shard, units)
    optimizer = make_optimizer(model)  # on the shards: each rank's optimizer state is its shards'
    restored = restore(run_dir, model, optimizer, cfg.train.resume_from)
    loader = build_loader(cfg.data, dataset, sampler(start_step=restored.step))
    t = ShardedTrainer(model=model, optimizer=optimizer, scaler=None, loader=loader, weights=model, **common)
    return t, restored


def restore(run_dir: Path, model: nn.Module, optimizer: Any, resume_from: str | None) -> checkpoint.Restored:
    """The newest usable checkpoint of either format, resharded to this world as it is read."""
    paths, skipped = checkpoint.candidates(run_dir, resume_from)
    for path in paths:
        if path.is_dir() and not (path / ".metadata").is_file():  # the same on every rank
            skipped.append(f"{path.name} is unusable (no .metadata: a partial checkpoint)")
            continue
        try:
            step = shard_checkpoint.load_sharded(path, model, optimizer)  # every rank agrees
        except checkpoint.CheckpointError as e:
            skipped.append(f"{path.name} {e}")
            continue
        return checkpoint.Restored(step, path, skipped)
    if skipped:
        raise checkpoint.none_usable(paths, run_dir, skipped)
    return checkpoint.Restored(0, None, [])
