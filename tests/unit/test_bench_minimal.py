"""The overhead benchmark's reading of its minimal scripts' output."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpctrain.bench.minimal import throughput


def test_throughput_is_set_by_the_slowest_process_even_from_interleaved_output() -> None:
    # two processes wrote to one pipe at once: the records are glued, not on lines of their own
    out = 'noise\n{"rank": 1, "size": 2, "timed_s": 2.0}{"rank": 0, "size": 2, "timed_s": 1.5}\n'
    assert throughput(out, batch=64, steps=60, warmup=10) == pytest.approx(64 * 2 * 50 / 2.0)
    with pytest.raises(ValueError, match="1 of 2 processes reported"):
        throughput('{"rank": 0, "size": 2, "timed_s": 1.5}', 64, 60, 10)


def test_horovods_contenders_are_left_out_where_it_cannot_run() -> None:
    from hpctrain.bench.overhead import Setup, contenders

    CONTENDERS = (
        "ceiling",
        "minimal horovod",
        "minimal ddp",
        "hpctrain horovod",
        "hpctrain ddp",
    )  # the default

    cpu, gpu = Setup(2, 1, 16, 8, 1), Setup(1, 1, 16, 8, 1, device="cuda")
    who, why = contenders(Setup(2, 1, 16, 8, 1, starter="spawn"), horovod=True, horovod_nccl=True)
    assert "minimal horovod" not in who and "spawn starts no MPI" in why
    assert contenders(cpu, horovod=True, horovod_nccl=False) == (list(CONTENDERS), "")
    who, why = contenders(cpu, horovod=False, horovod_nccl=False)
    assert who == ["ceiling", "minimal ddp", "hpctrain ddp"] and "not installed" in why
    who, why = contenders(gpu, horovod=True, horovod_nccl=False)
    assert "hpctrain horovod" not in who and "no NCCL" in why
    assert contenders(gpu, horovod=True, horovod_nccl=True)[0] == list(CONTENDERS)
    both = Setup(2, 1, 16, 8, 1, engines=("ddp", "fsdp"))
    assert contenders(both, horovod=False, horovod_nccl=False) == (
        ["ceiling", "minimal ddp", "minimal fsdp", "hpctrain ddp", "hpctrain fsdp"],
        "",
    )


@pytest.mark.parametrize(("engine", "model"), [("ddp", "cnn"), ("fsdp", "mlp"), ("ddp", "tiny")])
def test_the_hand_written_loops_run_spawned_and_both_sides_take_the_device(engine: str, model: str) -> None:
    import sys

    from hpctrain.bench import run_checked
    from hpctrain.bench.overhead import Setup, _minimal_argv, hpctrain_argv

    s = Setup(2, 1, 16, 4, 1, device="cpu", starter="spawn", model=model, engines=(engine,))
    argv = _minimal_argv(engine, s)
    assert argv[argv.index("--model") + 1] == model
    assert argv[:5] == [sys.executable, "-m", "hpctrain.launch.local.spawn", "-np", "2"] and "--" in argv
    assert argv[argv.index("--device") + 1] == "cpu"
    assert (
        throughput(run_checked(argv), s.batch, s.steps, s.warmup) > 0
    )  # a real run of the baseline, no mpirun
    ours = hpctrain_argv(engine, Path("/r"), s)
    assert ("parallelism=fsdp" in ours) == (engine == "fsdp") and "parallelism.engine=ddp" in ours
    assert ("model.width=2048" in ours) == (model == "mlp")
    assert ("model.width=16" in ours) == (model == "tiny")  # one hidden layer of 16: host-bound
    lr = argv[argv.index("--lr") + 1]
    assert f"optim.lr={lr}" in ours and (lr == "0.005") == (model == "tiny")  # both sides alike
    gpu = hpctrain_argv("ddp", Path("/r"), Setup(1, 1, 16, 4, 1, device="cuda", starter="spawn"))
    assert "train.device=cuda" in gpu and "cluster.starter=spawn" in gpu
    assert "--device" in _minimal_argv("ddp", Setup(1, 1, 16, 4, 1, device="cuda"))


def test_the_added_microseconds_are_a_steps_time_beyond_the_minimal_loops() -> None:
    from hpctrain.bench.overhead import Setup, added_us

    # 2 ranks x batch 1: a step of 2 samples; 2 samples at 1,000/s take 2 ms, at 2,000/s 1 ms
    assert added_us(1000.0, 2000.0, Setup(2, 1, 1, 100, 10)) == pytest.approx(1000.0)
    assert added_us(2000.0, 2000.0, Setup(2, 1, 1, 100, 10)) == 0.0
