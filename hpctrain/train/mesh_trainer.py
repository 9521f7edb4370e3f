"""The trainer over a device mesh, shared by the parallelisms that build on one: data parallelism
sharded by the engine (parallelism=fsdp | hsdp, FSDP2's fully_shard over the mesh of the plan's
layout), a model split by the layout's layer split (tensor parallelism: Setup.layer_split), or
both (2-D), with the named dimensions' ranks flattened into the data-parallel ones. The optimizer is built
on the shards, and checkpoints are sharded (shard_checkpoint.py). A step is the data-parallel one:
each rank a slice of the global batch; the engine's micro_batch holds the gradient sync back until
the last micro-batch of an accumulation."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch import nn

from hpctrain.config.split import shard_units
from hpctrain.engine.base import Sharding, TensorParallel
from hpctrain.engine.fsdp_wrap import data_parallel_mesh
from hpctrain.engine.ties import check_units
from hpctrain.engine.world import CommError
from hpctrain.train import checkpoint, shard_checkpoint
from hpctrain.train.compile import compile_blocks
from hpctrain.train.data import build_loader
from hpctrain.train.parts import workload_label
from hpctrain.train.setup import Setup, make_optimizer, recompute_blocks
from hpctrain.train.step import DataParallelTrainer, StepInput, StepResult
from hpctrain.train.targets import probe

if TYPE_CHECKING:
    from hpctrain.records import StepRecord
    from hpctrain.train.dims import LayerSplit


@dataclass(kw_only=True)
class ShardedTrainer(DataParallelTrainer):
    """Every rank holds a shard of the model (model and weights: the sharded module). Split by a
    layer split (tensor parallelism), its first warm-up step counts the split's collectives and the
    run replays them after training (train/dims.py: LayerSplit)."""

    layer_split: LayerSplit | None = None
    counted: bool = False

    def train_step(self, b: StepInput) -> StepResult:
        # a timed step is never slowed by the counting; nor is a compiled model counted: the
        # counting's dispatch mode would make dynamo skip its blocks for good
        if (
            self.layer_split is None
            or self.counted
            or self.cfg.train.compile
            or b.step >= self.cfg.train.warmup_steps
        ):
            return super().train_step(b)
        with self.layer_split.counting():
            out = super().train_step(b)
        self.counted = True
        return out

    def figures(self) -> dict[str, dict[str, Any]]:
        out = super().figures()
        return {**out, **self.layer_split.figures()} if self.layer_split is not None else out

    def after_training(
        self, out: list[StepRecord], world: int, rank: int
    ) -> tuple[tuple[float, float], float]:
        done = super().after_training(out, world, rank)
        if self.layer_split is not None:
            self.layer_split.after_training(self.device)
        return done

    def whole_model_state(self) -> dict[str, Any]:
        """Gathered into rank 0's memory (collective; the others get an empty dict)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_model_state_dict(self.model, options=opts)

    def save_checkpoint(self, run_dir: Path, step: int, master: bool) -> Path | None:
        return shard_checkpoint.save(run_dir, step, self.model, self.optimizer, master, self.engine.barrier)

    def grad_tensors(self) -> int:
        """FSDP's units: each all-gathers its parameters and reduce-scatters its gradients as one."""
        from torch.distributed.fsdp import FSDPModule

        return sum(1 for m in self.model.modules() if isinstance(m, FSDPModule))


def sharded_trainer(s: Setup) -> tuple[ShardedTrainer, checkpoint.Restored]:
    """fsdp/hsdp, and with parallelism.tp.degree > 1 2-D: each block split over a tensor-parallel
    group first, then sharded over the data-parallel part of the same mesh (TorchTitan's order)."""
    cfg, engine, layout = s.cfg, s.engine, s.d.layout
    if not isinstance(engine, Sharding):
        raise CommError(f"engine {engine.name} cannot shard a model")
    s.common["watch"].phase("comm", 0)  # sharding creates the mesh's process groups: every rank must arrive
    model, dp_mesh = s.module, None
    if s.layer_split is not None or layout.inner > 1:  # the whole mesh; else the engine's replicate x shard
        mesh = device_mesh(s)
        dp_mesh = data_parallel_mesh(mesh, layout)
        if s.layer_split is not None:
            model = split(s, mesh)
    recompute_blocks(s)
    compile_blocks(cfg, model, s.run_dir, s.notes)
    units = shard_units(cfg.model, list(cfg.parallelism.shard.modules))
    check_units(model, units)
    model = s.materialize(engine.shard(model, layout, units, dp_mesh))
    return dcp_trainer(s, model)


def dcp_trainer(s: Setup, model: nn.Module) -> tuple[ShardedTrainer, checkpoint.Restored]:
    """The optimizer on the model's shards (each rank's state is its shards'), restored from the
    newest usable checkpoint, sharded or whole."""
    cfg = s.cfg
    optimizer = make_optimizer(cfg, model, cfg.optim.lr)
    restored = restore(s.run_dir, model, optimizer, cfg.train.resume_from)
    loader = build_loader(cfg.data, s.dataset, s.sampler(start_step=restored.step))
    t = ShardedTrainer(
        model=model,
        optimizer=optimizer,
        scaler=None,
        loader=loader,
        weights=model,
        layer_split=s.layer_split,
        **s.common,
    )
    return t, restored


def tensor_parallel_trainer(s: Setup) -> tuple[ShardedTrainer, checkpoint.Restored]:
    """One replica, its layers split over the ranks (parallelism=data, tp.degree = the world)."""
    s.common["watch"].phase("comm", 0)  # the mesh's process groups: every rank must arrive
    model = s.materialize(split(s, device_mesh(s)))
    recompute_blocks(s)
    compile_blocks(s.cfg, model, s.run_dir, s.notes)
    return dcp_trainer(s, model)


def _tp_engine(s: Setup) -> TensorParallel:
    """The engine's tensor-parallel capability (the plan's rules refused engines without it)."""
    if not isinstance(s.engine, TensorParallel):
        raise CommError(f"engine {s.engine.name} cannot split a model over a device mesh")
    return s.engine


def device_mesh(s: Setup) -> Any:
    return _tp_engine(s).device_mesh(s.d.layout)


def split(s: Setup, mesh: Any) -> nn.Module:
    """The whole model split by the layout's layer split over its dimension of `mesh`."""
    how = s.layer_split
    if how is None:
        return s.module
    model = _tp_engine(s).split(s.module, lambda m: how.split(m, mesh, whole=True))
    if s.cfg.user_code:  # one sample through the split model (every rank of the group: collectives)
        probe(
            model,
            s.common["objective"],
            s.dataset,
            s.common["device"],
            f"{workload_label(s.cfg)} split by {how.key}",
            how.hint,
        )
    return model


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
