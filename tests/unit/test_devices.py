"""Devices and their measurement, on what a CPU can check: which GPU a local rank binds, the refusal
of more local ranks than GPUs, the clock's spans, the model FLOPs counted against a hand count,
the peak table and MFU's arithmetic."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from hpctrain.analysis.peak import achieved_tflops, mfu, table_peak
from hpctrain.config import load_config
from hpctrain.engine.clock import CudaClock, HostClock, clock_for
from hpctrain.engine.device import bind_device, device_index
from hpctrain.engine.horovod import HorovodEngine
from hpctrain.engine.registry import engine_for
from hpctrain.engine.world import launcher_local_rank
from hpctrain.errors import ConfigError
from hpctrain.facts import HostFacts
from hpctrain.orchestrate.validate import validate
from hpctrain.records import Layout
from hpctrain.train.data import build_dataset
from hpctrain.train.flops import device_peak, flops_per_sample


@pytest.mark.parametrize(
    "env,local",
    [
        ({"LOCAL_RANK": "3", "OMPI_COMM_WORLD_LOCAL_RANK": "1"}, 3),  # torchrun/spawn's own wins
        ({"OMPI_COMM_WORLD_LOCAL_RANK": "1", "SLURM_LOCALID": "0"}, 1),  # mpirun inside an allocation
        ({"SLURM_LOCALID": "2"}, 2),
        ({}, 0),  # a single process
    ],
)
def test_the_local_rank_comes_from_the_launcher_that_started_the_process(
    env: dict[str, str], local: int
) -> None:
    assert launcher_local_rank(env) == local


def test_each_local_rank_binds_its_own_gpu_or_the_one_the_scheduler_gave_it() -> None:
    assert [device_index(r, 4) for r in range(4)] == [0, 1, 2, 3]
    assert [device_index(r, 1) for r in range(4)] == [0, 0, 0, 0]  # CUDA_VISIBLE_DEVICES: one per task
    with pytest.raises(ValueError):
        device_index(0, 0)


def test_a_cpu_run_binds_no_gpu() -> None:
    assert bind_device("cpu", {"LOCAL_RANK": "1"}) == torch.device("cpu")
    if not torch.cuda.is_available():
        assert bind_device("auto", {"LOCAL_RANK": "1"}) == torch.device("cpu")


def test_more_local_ranks_than_gpus_is_refused_naming_both_counts() -> None:
    gpus = HostFacts.example(cuda_available=True, cuda_bf16=True, cuda_devices=2)
    with pytest.raises(ConfigError) as e:
        validate(load_config(["cluster.ranks=4"]), gpus)
    [problem] = [p for p in e.value.problems if p.key == "cluster.ranks"]
    assert "4 ranks on 2 GPU(s)" in problem.rule and "cluster.ranks=2" in problem.fix
    validate(load_config(["cluster.ranks=2"]), gpus)  # one GPU each
    validate(load_config(["cluster.ranks=4", "train.device=cpu"]), gpus)  # the CPUs: no GPU needed


def test_engine_horovod_without_horovod_installed_is_refused_with_the_fix(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import hpctrain.engine.horovod as module

    monkeypatch.setattr(module, "horovod_installed", lambda: False)
    [problem] = [p for p in HorovodEngine.problems(load_config([])) if p.key == "parallelism.engine"]
    assert "not installed" in problem.rule and "engine=ddp" in problem.fix


def test_host_clock_spans_are_host_time_and_cuda_devices_get_events() -> None:
    clock = HostClock()
    a = clock.mark()
    time.sleep(0.01)
    b = clock.mark()
    clock.settle(b)
    assert clock.seconds(a, b) >= 0.01
    assert isinstance(clock_for(torch.device("cpu")), HostClock)
    assert isinstance(clock_for(torch.device("cuda", 0)), CudaClock)


def test_model_flops_are_counted_as_by_hand_once_per_configuration(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the MLP 3072 -> 256 -> 256 -> 10: forward 2 * in * out per sample and layer; backward the
    # weight gradients (2 * in * out) everywhere and the input gradients except the first layer's
    monkeypatch.setenv("HPCTRAIN_CACHE", str(tmp_path))
    cfg = load_config(["model=mlp", "model.width=256", "model.depth=2"])
    layers = [(3072, 256), (256, 256), (256, 10)]
    by_hand = sum(4 * i * o for i, o in layers) + sum(2 * i * o for i, o in layers[1:])
    data = build_dataset(cfg.data, 0)
    assert (
        flops_per_sample(cfg, data, batch=8) == (by_hand, "FlopCounterMode") == (3_554_304, "FlopCounterMode")
    )
    # the same configuration again: read, not counted (counting imports torch._dynamo)
    assert flops_per_sample(cfg, data, batch=8) == (by_hand, "FlopCounterMode (cached)")
    [kept] = (tmp_path / "flops").iterdir()
    kept.write_text('{"flops_per_sample": "x"')  # damaged: counted again, and kept again
    assert flops_per_sample(cfg, data, batch=8) == (by_hand, "FlopCounterMode")
    assert flops_per_sample(cfg, data, batch=8)[1] == "FlopCounterMode (cached)"
    wider = load_config(["model=mlp", "model.width=128", "model.depth=2"])  # another configuration
    assert flops_per_sample(wider, data, batch=8)[1] == "FlopCounterMode"
    user = load_config(["model._target_=torch.nn.Flatten", "loss._target_=torch.nn.MSELoss"])
    flops_per_sample(user, [(torch.zeros(3), torch.zeros(3))], batch=2)  # user code: never cached
    assert len(list((tmp_path / "flops").iterdir())) == 2


def test_a_model_that_cannot_be_counted_says_why() -> None:
    class Scalarless:  # a dataset whose sample is no tensor
        def __getitem__(self, i: int) -> tuple[object, object]:
            return "x", 0

    flops, how = flops_per_sample(load_config([]), Scalarless(), 2)  # counted after training: never raises
    assert flops != flops and how.startswith("not counted: ")
    flops, how = flops_per_sample(load_config(["model=mlp"]), [(torch.zeros(5), torch.tensor(1))], 2)
    assert flops != flops and how.startswith("not counted: RuntimeError")  # 5 inputs, not 3072


@pytest.mark.parametrize(
    "name,precision,tflops",
    [
        ("NVIDIA H100 80GB HBM3", "bf16", 989.4),  # torch's name for the SXM part
        ("NVIDIA H100 PCIe", "fp16", 756.5),
        ("NVIDIA H100 80GB HBM3", "fp32", 66.9),
        ("NVIDIA H200", "bf16", 989.4),
        ("NVIDIA A100-SXM4-80GB", "bf16", 312.0),
    ],
)
def test_known_devices_have_their_datasheet_peak(name: str, precision: str, tflops: float) -> None:
    peak = table_peak(name, precision)
    assert peak is not None and peak.tflops == tflops and precision in peak.source


def test_an_unknown_device_has_no_peak_and_the_config_wins() -> None:
    assert table_peak("Some Future GPU", "bf16") is None
    cfg = load_config(["cluster.peak_tflops=12.5"])
    assert device_peak(cfg, torch.device("cpu")).tflops == 12.5


def test_the_cpu_peak_is_probed_once_per_host_and_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hpctrain.train import flops

    monkeypatch.setenv("HPCTRAIN_CACHE", str(tmp_path))
    cfg = load_config([])
    probed = device_peak(cfg, torch.device("cpu"))
    assert (
        probed.tflops > 0
        and probed.source == f"probe: 512x512 fp32 GEMM on {torch.get_num_threads()} thread(s)"
    )
    monkeypatch.setattr(flops, "gemm_probe_tflops", lambda *a: pytest.fail("probed again"))
    again = device_peak(cfg, torch.device("cpu"))
    # the cached figure says how old its probe is (round 5, class 5)
    assert again.tflops == probed.tflops and again.source == probed.source + ", cached 0 min ago"
    [kept] = (tmp_path / "peak").iterdir()
    for damaged in ("{", '{"tflops": -1}', '{"tflops": "x"}', "[]"):
        kept.write_text(damaged)  # probed again, never used
        monkeypatch.setattr(flops, "gemm_probe_tflops", lambda *a: 3.5)
        assert device_peak(cfg, torch.device("cpu")) == flops.Peak(3.5, probed.source)
    bf16 = device_peak(load_config(["precision=bf16"]), torch.device("cpu"))
    assert bf16.source.startswith("probe: 512x512 bf16 GEMM") and not bf16.source.endswith("cached")


def test_mfu_is_each_ranks_model_flops_over_its_peak() -> None:
    # 1 GFLOP per sample at 1000 samples/s over 2 ranks: 0.5 TFLOP/s each; a 2 TFLOP/s peak: 25%
    assert achieved_tflops(1e9, 1000.0, 2) == pytest.approx(0.5)
    assert mfu(1e9, 1000.0, 2, 2.0) == pytest.approx(0.25)
    assert mfu(1e9, 1000.0, 2, float("nan")) != mfu(1e9, 1000.0, 2, float("nan"))  # NaN: unknown


def test_the_summary_carries_mfu_and_stays_json_when_the_peak_is_unknown() -> None:
    import dataclasses
    import json

    from hpctrain.bench.analyze import synthetic_summary
    from hpctrain.train.stats import summarize

    ranks = synthetic_summary(2, 64, 0.1, 0.08, 0.015, 0.005).per_rank
    about = dict(started=0.0, finished=1.0, model="cnn", precision="fp32", backend="mpi", compression="none")
    known = summarize(ranks, 128, flops_per_sample=1e9, peak_tflops=2.0, peak_source="config", **about)
    by_hand = 1e9 * known.throughput_samples_per_s / 2 / 1e12  # TFLOP/s per rank
    assert known.tflops_per_rank == pytest.approx(by_hand) and known.mfu == pytest.approx(by_hand / 2.0)
    unknown = summarize(
        ranks, 128, flops_per_sample=1e9, peak_tflops=float("nan"), peak_source="unknown device", **about
    )
    assert (
        unknown.mfu is None
        and unknown.peak_tflops is None
        and unknown.tflops_per_rank == pytest.approx(by_hand)
    )
    json.dumps(dataclasses.asdict(unknown), allow_nan=False)  # strict JSON: no NaN


def test_horovod_without_nccl_is_refused_on_cuda_before_it_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    import horovod.torch as hvd

    from hpctrain.engine.world import CommError

    monkeypatch.setattr(hvd, "nccl_built", lambda: 0)  # as this machine's CPU build says
    with pytest.raises(CommError) as e:
        engine_for(load_config(["train.device=cuda"])).init(Layout(replicate=2))
    assert "nccl_built() is False" in str(e.value) and "HOROVOD_GPU_OPERATIONS=NCCL" in str(e.value)
    assert not hvd.is_initialized()  # refused before Horovod started
