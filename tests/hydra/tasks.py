"""Task functions of a user's Hydra app, run by the hpctrain launchers on every rank (imported by
reference: the ranks get the test run's import path from the launcher)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hydra.test_utils.test_utils import SweepTaskFunction, TSweepRunner
from omegaconf import DictConfig

ROWS = 32  # the global batch; each rank takes its equal share


def train(cfg: DictConfig) -> list[float]:
    """A linear model trained for cfg.steps full-batch SGD steps with the framework cfg.engine
    names: DDP over Gloo (torch.distributed's variables) or Horovod (its own world). Each rank
    takes its share of the batch and the frameworks average the gradients, so any number of
    ranks ends on one rank's weights. Returns the weights (every rank; Hydra gets rank 0's).
    Instrumented with hpctrain.api (no-ops outside hpctrain): step records, and at SLURM's
    signal a checkpoint the requeued job resumes from; cfg.hold (optional): on a fresh start,
    wait after that step until a stop is requested (for the tests)."""
    import time

    import torch

    from hpctrain import api

    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    x = torch.randn(ROWS, 4, generator=torch.Generator().manual_seed(1))
    y = x @ torch.tensor([1.0, -2.0, 3.0, 0.5]) + 0.1
    torch.manual_seed(0)
    model: torch.nn.Module = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=float(cfg.lr))
    if world > 1 and cfg.engine == "ddp":
        import torch.distributed as dist

        dist.init_process_group("gloo")
        model = torch.nn.parallel.DistributedDataParallel(model)
        optimizer = torch.optim.SGD(model.parameters(), lr=float(cfg.lr))
    elif world > 1:
        import horovod.torch as hvd

        hvd.init()
        assert hvd.size() == world and hvd.rank() == rank, (hvd.size(), hvd.rank())
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    layer = model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model
    state, start = api.load_checkpoint(), 0
    if state:
        layer.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = state["step"]
    hold = int(cfg.get("hold", -1))
    share = slice(rank * ROWS // world, (rank + 1) * ROWS // world)
    api.start_timer()
    for step in range(start, int(cfg.steps)):
        optimizer.zero_grad()
        loss = ((model(x[share]).squeeze(1) - y[share]) ** 2).mean()
        loss.backward()
        optimizer.step()
        api.step(samples=share.stop - share.start, loss=loss.item())
        deadline = time.monotonic() + 120  # a test that never signals fails, but does not hang
        while step == hold and start == 0 and not api.should_stop() and time.monotonic() < deadline:
            time.sleep(0.2)
        if api.should_stop():  # leave to be requeued; the requeued job returns the weights
            api.save_checkpoint(
                {"step": step + 1, "model": layer.state_dict(), "optimizer": optimizer.state_dict()}
            )
            return []
    return [*layer.weight.detach().flatten().tolist(), float(layer.bias.detach())]


def fail_on_rank_1(cfg: DictConfig) -> int:
    if os.environ.get("RANK") == "1":
        raise ValueError(f"rank 1 refuses x={cfg.x}")
    return int(cfg.x)


def sweep_of(
    runner: TSweepRunner, tmp_path: Path, task: Callable[[DictConfig], Any], overrides: list[str]
) -> SweepTaskFunction:
    """Hydra's own in-process sweep runner (hydra.test_utils) on `task`, without a config file,
    sweeping into tmp_path/sweep; enter it to run."""
    return runner(
        calling_file=None,
        calling_module="hydra.test_utils.a_module",
        task_function=task,
        config_path=None,
        config_name=None,
        overrides=overrides,
        temp_dir=str(tmp_path / "sweep"),
    )
