"""A pipeline whose stages are split by tensor parallelism and/or sharded by FSDP2, over one device
mesh pp x replicate x shard x tp (TorchTitan's order: cut into stages, split each over its "tp"
ranks, shard it over its data-parallel ranks, then run the schedule over "pp"):

  parallelism=fsdp parallelism.stages=2 parallelism.tp.degree=2 ...   3-D: PP x FSDP x TP
  parallelism=fsdp|hsdp parallelism.stages=2 ...                      PP x FSDP (HSDP)
  parallelism=pipeline|hybrid parallelism.tp.degree=2 ...             PP x TP (x replicas)

The model is cut along its chain of modules (config/split.py:declared_chain) into pieces that hold
the real modules under their whole-model names, where pipe.py's traced pieces hold a
graph that neither tensor parallelism nor FSDP can take. Every tensor-parallel rank of a stage has
a pipeline of its own (records.Layout.pipeline_of); a stage's replicas and shards are averaged by
FSDP2 (one shard: plain replicas), which torch.distributed.pipelining's stages drive (they hold
the gradient sync back until the last micro-batch). Checkpoints are sharded (.dcp, by parameter
name): they resume at any other layout, and the whole model is gathered for model.pt.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hpctrain.config.split import (
    chain_pieces,
    declared_chain,
    declared_checkpoint_blocks,
    split_points,
    units_within,
)
from hpctrain.engine.base import Sharding, TensorParallel
from hpctrain.engine.fsdp_wrap import data_parallel_mesh
from hpctrain.engine.ties import check_units, pipeline_ties, tied_groups
from hpctrain.engine.world import CommError
from hpctrain.parallel.pipeline.pipe import build_pipe
from hpctrain.parallel.pipeline.step import PipelineTrainer
from hpctrain.train import checkpoint, shard_checkpoint
from hpctrain.train.data import build_loader
from hpctrain.train.mesh_trainer import restore
from hpctrain.train.modules import ChainPiece, attach, checkpoint_blocks
from hpctrain.train.setup import Setup, make_optimizer


def my_pieces(s: Setup) -> tuple[list[ChainPiece], list[set[str]]]:
    """This rank's pieces of the chain (several under interleaved schedules), and every piece's
    parameter names (where a tied parameter's copies are: engine/ties.py)."""
    cfg, layout = s.cfg, s.d.layout
    segments = chain_pieces(declared_chain(cfg.model), split_points(cfg, layout.pieces))
    every = [ChainPiece(s.module, segment) for segment in segments]
    names = [{n for n, _ in p.named_parameters(remove_duplicate=False)} for p in every]
    return [every[k] for k in layout.pieces_of(s.info.rank)], names


def _engine(s: Setup) -> Any:
    if not isinstance(s.engine, TensorParallel) or not isinstance(s.engine, Sharding):
        raise CommError(f"engine {s.engine.name} cannot build a mesh of sharded or split stages")
    return s.engine


def split_piece(s: Setup, piece: nn.Module, mesh: Any) -> None:
    """The layer split's modules within `piece` split over its ranks of `mesh` (its plan was
    checked against the whole model at plan time and on the meta model)."""
    how = s.layer_split
    if how is not None:
        _engine(s).split(piece, lambda m: how.split(m, mesh, whole=False))


def shard_piece(s: Setup, piece: nn.Module, dp_mesh: Any) -> None:
    """`piece` sharded (or replicated: one shard) over its stage's data-parallel ranks, the
    declared units within it one by one."""
    names = {n for n, _ in piece.named_modules()}
    units = units_within(s.cfg.model, list(s.cfg.parallelism.shard.modules), names)
    check_units(piece, units)
    _engine(s).shard(piece, s.d.layout, units, dp_mesh)


@dataclass(kw_only=True)
class MeshPipelineTrainer(PipelineTrainer):
    """The pipeline's step; the checkpoint of this rank's pieces, sharded by parameter name."""

    held: nn.Module  # this rank's pieces under their whole-model names: what checkpoints save

    def whole_model_state(self) -> dict[str, Any]:
        """Gathered: each rank's pieces whole (collective over their shards and slices), then
        every stage's from its first replica's first tensor-parallel rank."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        full = get_model_state_dict(self.held, options=StateDictOptions(full_state_dict=True))
        layout, rank = self.pipe.layout, self.pipe.rank
        first = layout.replica_of(rank) == 0 and layout.tp_of(rank) == 0
        mine = {k: v.detach().cpu() for k, v in full.items() if isinstance(v, torch.Tensor)} if first else {}
        out: dict[str, Any] = {}
        for part in self.engine.allgather_object(mine):
            out.update(part)
        return out

    def save_checkpoint(self, run_dir: Path, step: int, master: bool) -> Path | None:
        return shard_checkpoint.save(run_dir, step, self.held, self.optimizer, master, self.engine.barrier)


def mesh_pipeline_trainer(s: Setup) -> tuple[MeshPipelineTrainer, checkpoint.Restored]:
    cfg, layout, rank = s.cfg, s.d.layout, s.info.rank
    device = s.common["device"]
    s.common["watch"].phase("comm", 0)  # the mesh's process groups: every rank must arrive
    mesh = _engine(s).device_mesh(layout)
    ties = tied_groups(s.module)  # before the pieces are split or sharded: then still one tensor
    pieces, piece_names = my_pieces(s)
    dp_mesh = data_parallel_mesh(mesh, layout, two_d=True) if layout.replicas * layout.inner > 1 else None
    for piece in pieces:
        split_piece(s, piece, mesh)
        if cfg.model.activation_checkpointing:
            checkpoint_blocks(piece, [n for n in declared_checkpoint_blocks(cfg.model) if n in piece.order])
        if dp_mesh is not None:
            shard_piece(s, piece, dp_mesh)
    held = _whole_named(pieces)
    s.materialize(held)
    spans = pipeline_ties(ties, piece_names, dict(zip(layout.pieces_of(rank), pieces)), layout, rank)
    del s.module  # this rank keeps its pieces only
    optimizer = make_optimizer(cfg, held, cfg.optim.lr)
    restored = restore(s.run_dir, held, optimizer, cfg.train.resume_from)
    pipe = build_pipe(
        cfg,
        list[nn.Module](pieces),
        layout,
        rank,
        device,
        mesh["pp"].get_group(),
        s.common["objective"],
        delay_s=s.common["delay_s"],
    )
    loader = build_loader(cfg.data, s.dataset, s.sampler(start_step=restored.step))
    t = MeshPipelineTrainer(
        pipe=pipe,
        optimizer=optimizer,
        scaler=None,
        loader=loader,
        weights=held,
        held=held,
        ties=spans,
        **s.common,
    )
    return t, restored


def _whole_named(pieces: list[ChainPiece]) -> nn.Module:
    """One module holding every piece's modules under their whole-model names."""
    out = nn.Module()
    for piece in pieces:
        for name in piece.order:
            attach(out, name, piece.get_submodule(name))
    return out
