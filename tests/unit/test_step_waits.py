"""Where a training step makes the host wait for the device. On a GPU every wait leaves the device
idle while the host queues what follows, and a small model's step is then as long as the host's
work (hpctrain bench overhead --device cuda): a step waits once, at its end, and reads everything
it measured (its spans, the data's arrival, the stop vote) after that wait. Checked on the host
clock, with a clock and an engine that log the order of their calls."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from hpctrain.config import load_config
from hpctrain.config.schema import Config
from hpctrain.engine.base import Engine
from hpctrain.engine.clock import HostClock, Mark
from hpctrain.engine.ddp import DdpEngine
from hpctrain.train.objective import LossOnOutput
from hpctrain.train.step import DataParallelTrainer, StepInput
from hpctrain.train.watchdog import Watchdog
from tests.engines.solo import SoloEngine


class LoggingClock(HostClock):
    def __init__(self, log: list[str]) -> None:
        self.log = log

    def settle(self, last: Mark) -> float:
        self.log.append("settle")
        return super().settle(last)


class LoggingEngine(SoloEngine):
    def __init__(self, log: list[str]) -> None:
        self.log = log

    def vote(self, flag: bool, step: int) -> Any:
        self.log.append("vote")
        return flag

    def vote_result(self, handle: Any) -> bool:
        self.log.append("vote_result")
        return bool(handle)


def _trainer(tmp_path: Path, clock: HostClock, engine: Engine, cfg: Config) -> DataParallelTrainer:
    model = nn.Linear(8, 2)
    return DataParallelTrainer(
        cfg=cfg,
        engine=engine,
        model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        scaler=None,
        loader=[],  # unused: train_step is given its batch
        device=torch.device("cpu"),
        objective=LossOnOutput(nn.CrossEntropyLoss()),
        weights=model,
        watch=Watchdog(tmp_path, 0, 1, 600),
        parameters=18,
        clock=clock,
    )


def test_a_step_waits_for_the_device_once_and_reads_the_stop_vote_after_that(tmp_path: Path) -> None:
    log: list[str] = []
    clock = LoggingClock(log)
    t = _trainer(tmp_path, clock, LoggingEngine(log), load_config([]))
    x, y = torch.randn(4, 8), torch.zeros(4, dtype=torch.long)
    arrived = clock.mark()
    r = t.train_step(StepInput(x, y, 0.1, 0, True, arrived))
    # before: the vote was read between the backward pass and the update, a wait in mid-step
    assert log == ["vote", "settle", "vote_result"]
    assert r.stop
    # the data's arrival is the step's first mark, read back after the one wait: on the host
    # clock the same instant the loop took it
    assert abs(r.began - arrived) < 1e-9 and r.began <= r.end
    assert abs((r.end - r.began) - (r.compute_s + r.comm_s)) < 1e-9


def test_accumulated_micro_batches_log_the_batch_mean_and_wait_once(tmp_path: Path) -> None:
    log: list[str] = []
    clock = LoggingClock(log)
    torch.manual_seed(0)
    t = _trainer(tmp_path, clock, LoggingEngine(log), load_config(["parallelism.backward_passes_per_step=2"]))
    x, y = torch.randn(4, 8), torch.tensor([0, 1, 1, 0])
    with torch.no_grad():
        want = float(nn.CrossEntropyLoss()(t.model(x), y))  # the whole batch, before the update
    r = t.train_step(StepInput(x, y, 0.1, 0, None, clock.mark()))
    assert log == ["settle"]  # no vote asked for: none started or read
    assert abs(r.loss - want) < 1e-6  # two halves' losses, each divided by 2, summed


def test_one_rank_of_torch_distributed_votes_without_a_collective() -> None:
    engine = DdpEngine.__new__(DdpEngine)  # no process group: a collective would fail here
    engine.size = 1
    assert engine.vote_result(engine.vote(True, 3)) is True
    assert engine.vote_result(engine.vote(False, 4)) is False


def _writes() -> int:
    """Write system calls this process has made (the kernel's count: /proc/self/io syscw)."""
    fields = dict(line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())
    return int(fields["syscw"])


def test_a_steps_host_work_stays_within_its_budget(tmp_path: Path) -> None:
    """Counted, not timed: per step the loop waits for the device once, starts and reads one stop
    vote, and makes one write system call, its record's (kept a line a step so that a rank killed
    by a signal loses none: train/loop.py). A change that adds a wait, a collective or a write
    per step fails here."""
    from hpctrain.parallel import derive
    from hpctrain.train.loop import Place, _steps
    from hpctrain.train.stop import StopControl

    steps = 300
    cfg = load_config(
        [
            f"train.steps={steps}",
            "train.warmup_steps=10",
            "train.batch_per_rank=4",
            "train.log_interval=100000",
        ]
    )
    log: list[str] = []
    t = _trainer(tmp_path, LoggingClock(log), LoggingEngine(log), cfg)
    t.loader = [(torch.randn(4, 8), torch.zeros(4, dtype=torch.long)) for _ in range(steps)]
    said: list[str] = []
    before = _writes()
    out = _steps(t, Place(0, derive(cfg), tmp_path), 0, said.append, StopControl())
    writes = _writes() - before
    assert out is not None and len(out) == steps
    assert log.count("settle") == steps and log.count("vote") == log.count("vote_result") == steps
    assert len((tmp_path / "steps-rank0.jsonl").read_text().splitlines()) == steps
    # one a step, and a few of the harness and the heap trim: a second write a step would be 600
    assert writes <= steps + 30, f"{writes} write system calls for {steps} steps"
