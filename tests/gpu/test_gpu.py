"""The GPU tier (bash scripts/test.sh --gpu): what only a CUDA device can show. Every rank on its
own device over NCCL, the step's split measured with CUDA events (a delay injected on the compute
stream lands in compute, one the compute stream waits for on another stream lands in exposed
communication, each within 10%), mixed precision with its scaler, peak memory, MFU against the
device's datasheet peak, a profiler trace with the kernels summarised, and the spawn starter.

Tests that need more GPUs than the machine has are listed as not run, with the count they need
(tests/conftest.py). Runs start through spawn: a GPU node or container often has no mpirun."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from hpctrain.engine.clock import CudaClock
from hpctrain.records import StepRecord
from hpctrain.train.objective import LossOnOutput
from hpctrain.train.step import DataParallelTrainer, StepInput
from hpctrain.train.watchdog import Watchdog
from tests.conftest import DIGITS_CNN, assert_same_weights, hpctrain, run_ok
from tests.engines.solo import SoloEngine

pytestmark = pytest.mark.gpu

ONE_GPU = ["cluster.starter=spawn", "cluster.ranks=1", "train.device=cuda"]
DELAY_S = 0.05


def sleep_cycles(seconds: float) -> int:
    """torch.cuda._sleep spins for clock cycles: calibrated against CUDA events here."""
    probe = 50_000_000
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(1000)  # warm-up
    a.record()
    torch.cuda._sleep(probe)
    b.record()
    b.synchronize()
    return int(probe * seconds / (a.elapsed_time(b) / 1e3))


def test_the_clock_measures_the_device_not_the_host() -> None:
    clock, cycles = CudaClock(), sleep_cycles(DELAY_S)
    t0 = time.perf_counter()
    a = clock.mark()
    torch.cuda._sleep(cycles)
    b = clock.mark()
    host = time.perf_counter() - t0  # queueing the sleep returns at once
    clock.settle(b)
    assert clock.seconds(a, b) == pytest.approx(DELAY_S, rel=0.1)
    assert host < DELAY_S / 5


class Sleepy(nn.Module):
    """A tiny model whose forward sleeps on the compute stream: the injected compute."""

    def __init__(self, cycles: int) -> None:
        super().__init__()
        self.cycles, self.fc = cycles, nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        torch.cuda._sleep(self.cycles)
        return self.fc(x)


class SideStreamComm(SoloEngine):
    """Communication as NCCL does it: work on another stream that the compute stream waits for
    before the update (DDP's final callback, Horovod's synchronize)."""

    def __init__(self, cycles: int) -> None:
        self.cycles, self.side = cycles, torch.cuda.Stream()

    def wait_gradients(self, optimizer: object) -> None:
        self.side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.side):
            torch.cuda._sleep(self.cycles)
        torch.cuda.current_stream().wait_stream(self.side)


def test_injected_delays_land_in_compute_and_in_exposed_communication(tmp_path: Path) -> None:
    cycles, device = sleep_cycles(DELAY_S), torch.device("cuda", torch.cuda.current_device())
    model = Sleepy(cycles).to(device)
    clock = CudaClock()
    from hpctrain.config import load_config

    cfg, engine = load_config([]), SideStreamComm(2 * cycles)
    t = DataParallelTrainer(
        cfg=cfg,
        engine=engine,
        model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        scaler=None,
        loader=[],  # unused: train_step is given its batch
        device=device,
        objective=LossOnOutput(nn.CrossEntropyLoss()),
        weights=model,
        watch=Watchdog(tmp_path, 0, 1, 600),
        parameters=18,
        clock=clock,
    )
    x, y = torch.randn(4, 8, device=device), torch.zeros(4, dtype=torch.long, device=device)
    for step in range(3):  # the first warms cuBLAS up
        r = t.train_step(StepInput(x, y, 0.1, step, None, clock.mark()))
    assert r.compute_s == pytest.approx(DELAY_S, rel=0.1)
    assert r.comm_s == pytest.approx(2 * DELAY_S, rel=0.1)


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_one_rank_ddp_over_nccl_on_the_gpu(tmp_path: Path, precision: str) -> None:
    run, s = run_ok(
        tmp_path,
        precision,
        *ONE_GPU,
        "parallelism.engine=ddp",
        "model=transformer",
        "data=tokens",
        f"precision={precision}",
        "train.steps=12",
    )
    env = json.loads((run / "env.json").read_text())
    assert env["backend"] == "nccl" and env["cuda_devices"] and s["backend"] == "nccl"
    assert s["peak_memory_bytes"][0] > 0 and s["last_loss"] == s["last_loss"]  # CUDA's allocator, finite
    assert 0 < s["mfu"] < 1 and s["peak_source"].startswith(("table: ", "config"))
    steps = [StepRecord(**json.loads(line)) for line in (run / "steps-rank0.jsonl").read_text().splitlines()]
    timed = [r for r in steps if r.timed]
    # the parts of a step add up to it: device spans and host data wait, settled once per step
    for r in timed:
        assert r.data_s + r.compute_s + r.comm_s == pytest.approx(r.step_s, rel=0.1, abs=2e-4)


def test_one_rank_fsdp_over_nccl_on_the_gpu(tmp_path: Path) -> None:
    _, s = run_ok(
        tmp_path, "fsdp", *ONE_GPU, "parallelism=fsdp", "model=mlp", "precision=bf16", "train.steps=8"
    )
    assert s["parallelism"] == "fsdp" and 0 < s["mfu"] < 1


def test_a_profiled_gpu_run_has_its_kernels_summarised(tmp_path: Path) -> None:
    run, _ = run_ok(
        tmp_path, "prof", *ONE_GPU, "parallelism.engine=ddp", "profile.enabled=true", "train.steps=8"
    )
    r = hpctrain("analyze", str(run))
    assert r.returncode == 0, r.stderr
    assert "GPU kernels in the window" in r.stdout


def test_more_local_ranks_than_gpus_is_refused_before_the_start(tmp_path: Path) -> None:
    n = torch.cuda.device_count()
    r = hpctrain(
        "run",
        f"run.dir={tmp_path / 'r'}",
        "cluster.starter=spawn",
        f"cluster.ranks={n + 1}",
        "train.device=cuda",
        "parallelism.engine=ddp",
    )
    assert r.returncode == 2 and f"{n + 1} ranks on {n} GPU(s)" in r.stderr
    assert not (tmp_path / "r").exists()


@pytest.mark.gpu(2)
def test_two_gpus_two_ranks_equal_one_rank_each_on_its_own_device(tmp_path: Path) -> None:
    # fp32 without TF32 (torch's default for matmuls): the same weights as one rank with the batch
    one, _ = run_ok(
        tmp_path, "one", *DIGITS_CNN, *ONE_GPU, "parallelism.engine=ddp", "train.batch_per_rank=32"
    )
    two, s = run_ok(
        tmp_path,
        "two",
        *DIGITS_CNN,
        "cluster.starter=spawn",
        "cluster.ranks=2",
        "train.device=cuda",
        "parallelism.engine=ddp",
        "train.batch_per_rank=16",
    )
    assert_same_weights(one, two, rtol=1e-5, atol=1e-6)
    assert s["probe_full_s"] > 0  # the run's own all-reduce, on device tensors over NCCL


@pytest.mark.parametrize("layout", [["parallelism=data", "parallelism.engine=ddp"], ["parallelism=fsdp"]])
def test_the_predicted_peak_is_within_15_percent_of_the_allocators(tmp_path: Path, layout: list[str]) -> None:
    """On a GPU the run reports the CUDA allocator's peak (the context is outside it): the
    prediction of the same quantity (memory/predict.py: `reported`) within 15%; the fit adds the
    context, measured once on this host."""
    from hpctrain.config.load import load_config
    from hpctrain.memory.predict import predict

    point = [
        "model=transformer", "model.width=512", "model.depth=8", "model.heads=8", "data=tokens",
        "optim.name=adamw", "train.batch_per_rank=16", "train.steps=4", "train.warmup_steps=1", *layout, *ONE_GPU,
    ]  # fmt: skip
    p = predict(load_config(point), gpus=True).worst
    assert not p.fixed_in_peak and p.fixed > 0 and p.data == 0
    _, s = run_ok(tmp_path, "run", *point)
    measured = max(s["peak_memory_bytes"])
    assert 0.85 <= p.reported / measured <= 1.15, (p, measured)
