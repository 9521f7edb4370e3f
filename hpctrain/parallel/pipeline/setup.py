"""The pipeline's trainer on a rank (parallelism=pipeline | hybrid): this rank's pieces of the
model under the schedule; a stage's replicas average their gradients through the engine.
Checkpoints hold the whole model (gathered at save)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from hpctrain.engine.base import StageReplicas
from hpctrain.engine.device import ensure_process_group
from hpctrain.engine.world import CommError
from hpctrain.parallel.pipeline.pipe import (
    StageOptimizer,
    StageWeights,
    build_pipe,
    make_groups,
    pieces_for,
)
from hpctrain.parallel.pipeline.step import PipelineTrainer
from hpctrain.train import checkpoint
from hpctrain.train.data import build_loader
from hpctrain.train.setup import Setup, make_optimizer
from hpctrain.train.step import Trainer


def pipeline_trainer(s: Setup) -> tuple[Trainer, checkpoint.Restored]:
    cfg, layout, rank = s.cfg, s.d.layout, s.info.rank
    device = s.common["device"]
    s.materialize(s.module)
    ensure_process_group(device, cfg.train.stall_timeout_s)
    pp_group, dp_group = make_groups(layout, rank)
    objective = s.common["objective"]
    x0, y0 = (micro_batch_like(v, s.d.batch.micro, device) for v in s.dataset[0])
    targets_kw = objective.targets_name(s.module)
    pieces, ties = pieces_for(cfg, s.module, layout, rank, objective.inputs(x0, y0), device)
    del s.module  # this rank keeps its pieces only
    base = make_optimizer(cfg, nn.ModuleList(pieces), cfg.optim.lr)
    run, optimizer = pieces, base
    if layout.replicas > 1:
        if not isinstance(s.engine, StageReplicas):
            raise CommError(f"engine {s.engine.name} cannot average a pipeline stage over its replicas")
        run, optimizer = s.engine.wrap_stage(pieces, base, dp_group)
    stage = layout.stage_of(rank)
    weights = StageWeights(pieces)
    restored = checkpoint.restore(
        s.run_dir, weights, StageOptimizer(optimizer, stage), None, cfg.train.resume_from
    )
    pipe = build_pipe(cfg, run, layout, rank, device, pp_group, objective, targets_kw, s.common["delay_s"])
    loader = build_loader(cfg.data, s.dataset, s.sampler(start_step=restored.step))
    t = PipelineTrainer(
        pipe=pipe,
        optimizer=optimizer,
        scaler=None,
        loader=loader,
        weights=weights,
        ties=ties,
        **s.common,
    )
    return t, restored


def micro_batch_like(sample: Any, micro: int, device: torch.device) -> torch.Tensor:
    """A micro-batch of `micro` copies of one sample (what the pipeline is traced on: the traced
    graph is specialised to its shape)."""
    t = torch.as_tensor(sample)
    return t.unsqueeze(0).expand(micro, *t.shape).contiguous().to(device)
