"""Real runs: hpctrain's CLI starts OpenMPI's mpirun, Horovod and PyTorch training.

Nothing here is faked or skipped: a missing mpirun or Horovod fails these tests.
"""

from __future__ import annotations

import io
import json
import math
import socket
import statistics
from pathlib import Path

import pytest
import torch
from rich.console import Console

from hpctrain.records.restarts import read_restarts
from tests.conftest import (
    DIGITS_CNN,
    assert_same_weights,
    hpctrain,
    hpctrain_here,
    run_ok,
    steps_of,
    weights,
)

pytestmark = pytest.mark.mpi

BASE = DIGITS_CNN


def test_two_ranks_half_batch_equal_one_rank_full_batch(
    tmp_path: Path, reference, one_rank_reference
) -> None:
    """Gradients are averaged correctly: 2 x B/2 over Horovod == 1 x B, step for step."""
    one, s1 = one_rank_reference
    two, s2 = reference
    assert (s1["world_size"], s2["world_size"]) == (1, 2)
    assert s1["global_batch"] == s2["global_batch"] == 32
    assert_same_weights(one, two, rtol=1e-5, atol=1e-6)
    # and the runs really trained: the weights moved away from the (shared) initialisation
    init = run_ok(
        tmp_path,
        "zero",
        *BASE[:-3],
        "train.steps=2",
        "train.warmup_steps=0",
        "optim.lr=1e-12",
        "cluster.ranks=1",
        "train.batch_per_rank=32",
    )[0]
    assert not torch.allclose(weights(one)["head.weight"], weights(init)["head.weight"], atol=1e-3)


def test_gradient_accumulation_equals_the_full_batch(tmp_path: Path, reference) -> None:
    acc, _ = run_ok(
        tmp_path,
        "acc",
        *BASE,
        "cluster.ranks=2",
        "train.batch_per_rank=16",
        "parallelism.backward_passes_per_step=4",
    )
    assert_same_weights(reference[0], acc, rtol=1e-5, atol=1e-6)


def test_gloo_backend_is_what_horovod_runs_on_and_trains_like_mpi(tmp_path: Path, reference) -> None:
    gloo, _ = run_ok(
        tmp_path, "gloo", *BASE, "cluster.ranks=2", "train.batch_per_rank=16", "parallelism.backend=gloo"
    )
    # Horovod's own report of its controller at run time, not the config read back
    runtime = json.loads((gloo / "env.json").read_text())["horovod_runtime"]
    assert runtime == {"gloo_enabled": True, "mpi_enabled": False}
    mpi_runtime = json.loads((reference[0] / "env.json").read_text())["horovod_runtime"]
    assert mpi_runtime == {"gloo_enabled": False, "mpi_enabled": True}
    assert_same_weights(reference[0], gloo, rtol=1e-5, atol=1e-6)


def test_fp16_compression_changes_the_result_within_fp16_rounding(tmp_path: Path, reference) -> None:
    """Gradients really travel as fp16: the weights differ from the uncompressed run, by no more
    than fp16 rounding of the gradients would explain (2^-11 relative, accumulated over 12 steps)."""
    fp16, _ = run_ok(
        tmp_path,
        "fp16c",
        *BASE,
        "cluster.ranks=2",
        "train.batch_per_rank=16",
        "parallelism.compression=fp16",
    )
    a, b = weights(reference[0]), weights(fp16)
    assert any(not torch.equal(a[k], b[k]) for k in a), "fp16 compression left every weight unchanged"
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=1e-2, atol=1e-3, msg=lambda m: f"{k}: {m}")


@pytest.fixture(scope="module")
def precision_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, dict]]:
    tmp = tmp_path_factory.mktemp("precision")
    return {
        p: run_ok(
            tmp,
            p,
            "data=digits",
            f"precision={p}",
            "train.steps=60",
            "train.warmup_steps=5",
            "train.batch_per_rank=32",
            "optim.lr=0.05",
        )
        for p in ("fp32", "fp16", "bf16")
    }


@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
def test_every_precision_trains_and_loss_falls(precision_runs, precision: str) -> None:
    s = precision_runs[precision][1]
    assert s["first_loss"] == pytest.approx(math.log(10), abs=0.3)  # 10 classes before training
    assert s["last_loss"] < 0.6 * s["first_loss"], s


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_reduced_precision_really_computes_in_reduced_precision(precision_runs, precision: str) -> None:
    """The same seeds and data as the fp32 run: only autocast's rounding can make the weights
    differ, and it must (bf16 keeps 8 bits of mantissa, fp16 11)."""
    a, b = weights(precision_runs["fp32"][0]), weights(precision_runs[precision][0])
    diff = max(float((a[k] - b[k]).abs().max()) for k in a)
    assert 1e-6 < diff < 0.2, diff


@pytest.mark.parametrize("engine", [[], ["parallelism.engine=ddp"]], ids=["horovod", "ddp"])
def test_the_step_time_split_puts_a_stragglers_delay_in_the_others_communication(
    tmp_path: Path, engine: list[str]
) -> None:
    """Rank 1 sleeps 0.2 s before every backward pass. That is rank 1's compute; rank 0 waits for
    it in the gradient allreduce (Horovod's synchronize, DDP's stamp of where its last bucket was
    ready), so the delay shows as rank 0's exposed communication."""
    delay = 0.2
    run_dir, _ = run_ok(
        tmp_path,
        "straggler",
        *BASE[:2],
        "train.steps=8",
        "train.warmup_steps=2",
        "debug.slow_rank=1",
        f"debug.slow_s={delay}",
        *engine,
    )
    timed = {r: [x for x in steps_of(run_dir, r) if x["timed"]] for r in (0, 1)}
    med = {
        (r, key): statistics.median(x[key] for x in timed[r])
        for r in (0, 1)
        for key in ("data_s", "compute_s", "comm_s")
    }
    assert med[1, "compute_s"] >= delay  # the sleep is in the straggler's compute ...
    assert med[0, "compute_s"] < delay / 2  # ... not in the other rank's ...
    grown = med[0, "comm_s"] - med[1, "comm_s"]
    # ... which waits for it in the allreduce: most of the sleep, and never more than the
    # straggler's whole step, its data wait included (bounds from the records, not the wall
    # clock: a loaded machine stretches the straggler's compute, and with it the wait; a run
    # once failed the bound without the data wait by 0.07 ms)
    assert 0.6 * delay < grown < med[1, "data_s"] + med[1, "compute_s"] + med[1, "comm_s"], med
    # the summary names that wait load imbalance: step by step, the slowest rank's data + compute
    # minus each rank's own, as recomputed here from the step records
    s = json.loads((run_dir / "summary.json").read_text())
    busy = {r: {x["step"]: x["data_s"] + x["compute_s"] for x in timed[r]} for r in (0, 1)}
    top = {k: max(busy[0][k], busy[1][k]) for k in busy[0]}
    waits = [statistics.fmean(top[k] - busy[r][k] for k in top) for r in (0, 1)]
    assert [x["wait_s"] for x in s["per_rank"]] == pytest.approx(waits, rel=1e-9)
    assert waits[0] > 0.6 * delay and waits[1] < 0.1 * delay  # rank 0 waits for rank 1
    assert s["imbalance_s"] == pytest.approx(statistics.fmean(waits), rel=1e-9)
    from hpctrain.analysis.roofline import for_run
    from hpctrain.commands.ui import summary_table
    from hpctrain.records import RunSummary, read

    summary = read(run_dir / "summary.json", RunSummary)
    roof = for_run(summary)
    assert roof is not None and roof.imbalanced and "slowest one (load imbalance)" in roof.knob
    assert roof.exposed_s == pytest.approx(max(s["comm_s"] - s["imbalance_s"], 0.0))
    out = io.StringIO()
    Console(file=out, width=200).print(summary_table(summary))
    assert "waiting for the slowest rank" in out.getvalue() and "(slowest: rank 1)" in out.getvalue()


def test_records_are_complete(reference) -> None:
    run_dir, s = reference
    for name in (
        "config.yaml",
        "plan.json",
        "env.json",
        "summary.json",
        "model.pt",
        "steps-rank0.jsonl",
        "steps-rank1.jsonl",
        "logs/rank0.log",
        "logs/rank1.log",
    ):
        assert (run_dir / name).is_file(), name
    steps = steps_of(run_dir, 1)
    assert [r["step"] for r in steps] == list(range(12))
    assert [r["timed"] for r in steps] == [False, False] + [True] * 10
    env = json.loads((run_dir / "env.json").read_text())
    assert env["horovod"] == "0.28.1" and env["horovod_build"]["mpi"]
    assert env["mpi_library"].startswith("Open MPI v") and "\x00" not in env["mpi_library"]
    assert len(env["hosts"]) == 2
    assert s["world_size"] == 2 and len(s["per_rank"]) == 2 and s["timed_steps"] == 10
    # the summary is the aggregate of the step records: the mean over both ranks' timed steps, and
    # throughput from the slower rank's timed wall time (32 samples x 10 steps)
    timed = {r: [x for x in steps_of(run_dir, r) if x["timed"]] for r in (0, 1)}
    every = timed[0] + timed[1]
    assert s["step_s"] == pytest.approx(statistics.fmean(x["step_s"] for x in every), rel=1e-9)
    assert s["comm_s"] == pytest.approx(statistics.fmean(x["comm_s"] for x in every), rel=1e-9)
    wall = max(sum(x["step_s"] for x in timed[r]) for r in (0, 1))
    assert s["throughput_samples_per_s"] == pytest.approx(32 * 10 / wall, rel=1e-9)
    # the run's own allreduce probe (one value, and the gradients' size) places it on a roofline
    from hpctrain.analysis.roofline import for_run
    from hpctrain.records import RunSummary, read

    assert s["grad_tensors"] == len(weights(run_dir)) and s["grad_bucket_bytes"] == 64 * 2**20
    assert s["probe_small_s"] > 0 and s["probe_full_s"] > 0 and s["threads_per_rank"] >= 1
    roof = for_run(read(run_dir / "summary.json", RunSummary))
    assert roof is not None and roof.messages == 1 and roof.grad_bytes == 4 * s["parameters"]
    assert roof.latency_s == pytest.approx(s["probe_small_s"])
    # the exposed time is the transfer's: the wait for the slower rank is counted apart
    assert s["imbalance_s"] >= 0
    assert roof.exposed_s == pytest.approx(max(s["comm_s"] - s["imbalance_s"], 0.0))
    assert roof.wait_s == pytest.approx(s["imbalance_s"])


def test_a_failing_rank_is_named_with_its_traceback_and_the_run_stops_at_that_step(tmp_path: Path) -> None:
    run_dir = tmp_path / "exc"
    r = hpctrain(
        "run",
        "--no-progress",
        f"run.dir={run_dir}",
        *BASE,
        "train.steps=400",
        "debug.fail_rank=1",
        "debug.fail_step=5",
        timeout=180,
    )
    assert r.returncode == 4, r.stderr
    assert "rank 1 failed: InjectedFailure: injected failure on rank 1 at step 5" in r.stderr, r.stderr
    # the rank's last output, its traceback, is part of the message
    assert "last output of that rank:" in r.stderr and "in _inject_failure" in r.stderr, r.stderr
    err = json.loads((run_dir / "error-rank1.json").read_text())
    assert (err["rank"], err["host"], err["type"]) == (1, socket.gethostname(), "InjectedFailure")
    assert err["message"] == "injected failure on rank 1 at step 5 (debug.fail_rank/fail_step)"
    assert err["traceback"].startswith("Traceback") and err["traceback"].rstrip().endswith(err["message"])
    # Stopped at once, not after 400 steps: neither rank completed step 5 (rank 0 was waiting in
    # that step's allreduce when mpirun stopped it).
    assert [x["step"] for x in steps_of(run_dir, 0)] == [0, 1, 2, 3, 4]
    assert [x["step"] for x in steps_of(run_dir, 1)] == [0, 1, 2, 3, 4]
    assert not (run_dir / "summary.json").exists()


def test_fsdp_counts_a_wait_inside_backward_as_compute_as_the_readme_says(tmp_path: Path) -> None:
    """FSDP's stamp is the last unit's backward hook: what backward() takes after it is exposed
    communication (the reduce-scatters). A rank that waits for a straggler earlier, in the
    all-gather of the first unit's backward, counts that wait as compute (README, FSDP): the
    delay shows in both ranks' compute, and rank 0's exposed communication stays small."""
    delay = 0.2
    run_dir, _ = run_ok(
        tmp_path, "fsdp-straggler", *BASE[:2], "parallelism=fsdp", "train.steps=8", "train.warmup_steps=2",
        "debug.slow_rank=1", f"debug.slow_s={delay}",
    )  # fmt: skip
    timed = {r: [x for x in steps_of(run_dir, r) if x["timed"]] for r in (0, 1)}
    med = {(r, k): statistics.median(x[k] for x in timed[r]) for r in (0, 1) for k in ("compute_s", "comm_s")}
    assert med[1, "compute_s"] >= delay and med[0, "compute_s"] >= 0.6 * delay, med
    assert med[0, "comm_s"] < 0.5 * delay, med
    s = json.loads((run_dir / "summary.json").read_text())
    assert s["comm_s"] > 0 and s["grad_grouping"] == "shards", s  # a stamp was taken: the tail is measured


@pytest.mark.parametrize("engine", ["horovod", "ddp"])
def test_a_killed_rank_is_named_with_its_signal_and_last_output(tmp_path: Path, engine: str) -> None:
    run_dir = tmp_path / "kill"
    r = hpctrain(
        "run",
        "--no-progress",
        f"run.dir={run_dir}",
        *BASE,
        f"parallelism.engine={engine}",
        "train.steps=400",
        "debug.fail_rank=0",
        "debug.fail_step=9",
        "debug.fail_mode=kill",
        timeout=180,
    )
    assert r.returncode == 4, r.stderr
    assert "rank 0 failed" in r.stderr and "signal 9" in r.stderr, r.stderr
    tail = r.stderr.split("last output of that rank:")[1]
    assert "step 8/400" in tail and "step 12/400" not in tail, r.stderr  # rank 0 logs every 4 steps
    assert "@@hpctrain" not in tail, tail  # its progress events are for the progress bar, not output
    assert not (run_dir / "error-rank0.json").exists()  # SIGKILL leaves no time to write one
    assert [x["step"] for x in steps_of(run_dir, 1)] == list(range(9))
    # the survivor (DDP's rank 1 sees its peer's socket close) says so in one line, its stack kept
    # in its error record: no traceback for what is only the consequence
    survivor = (run_dir / "logs" / "rank1.log").read_text()
    assert "Traceback" not in survivor, survivor
    if (run_dir / "error-rank1.json").exists():
        assert json.loads((run_dir / "error-rank1.json").read_text())["traceback"].startswith("Traceback")


def test_a_killed_rank_restarts_the_run_in_place_bit_identical_to_an_uninterrupted_one(
    tmp_path: Path, reference: tuple[Path, dict]
) -> None:
    """The reference run (2 ranks, 12 steps) again, with rank 1 killed at step 7 of its first
    attempt and checkpoints every 4 steps: the supervisor starts new ranks, which resume at step
    4 and end on the reference's weights exactly."""
    run_dir = tmp_path / "restart"
    r = hpctrain(
        "run",
        "--no-progress",
        f"run.dir={run_dir}",
        *BASE,
        "cluster.ranks=2",
        "train.batch_per_rank=16",
        "cluster.checkpoint_interval=4",
        "train.max_restarts=1",
        "debug.fail_rank=1",
        "debug.fail_step=7",
        "debug.fail_mode=kill",
        "cluster.preflight.enabled=true",
        timeout=240,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    said = r.stdout + r.stderr
    assert "hpctrain: restart 1: rank 1: killed by signal 9" in said, said
    assert "resumed from step 4, 3 step(s) redone" in said, said
    ref, mine = weights(reference[0]), weights(run_dir)
    assert all(torch.equal(ref[k], mine[k]) for k in ref), "a restart must not change the weights"
    [restart] = read_restarts(run_dir)
    assert (restart.attempt, restart.rank, restart.failed_at_step, restart.resumed_from) == (1, 1, 7, 4)
    assert restart.host == socket.gethostname() or restart.host is None  # SIGKILL writes no error file
    assert 0 < restart.node_hours_lost < 1e-2
    s = json.loads((run_dir / "summary.json").read_text())
    assert (s["restarts"], s["steps_redone"], s["timed_steps"]) == (1, 3, 10), s
    assert [x["step"] for x in steps_of(run_dir, 0)] == list(range(12))  # the redone steps once
    assert not list(run_dir.glob("error-rank*.json"))  # the failed attempt's are set aside (.json.N)
    st = hpctrain_here("status", str(run_dir)).stdout
    assert "COMPLETED" in st and "1 restart" in st and "restart 1: rank 1" in st, st
    # each attempt checked the node first (its GEMM and the ranks' ring over MPI) and found it good
    checks = [json.loads(line) for line in (run_dir / "preflight.json").read_text().splitlines()]
    assert len(checks) == 2 and all(v["bad"] is False for c in checks for v in c["verdicts"]), checks
    assert all(p["tflops"] > 0 and p["link_gbps"] > 0 for c in checks for p in c["probes"]), checks


def test_hpctrain_preflight_checks_the_node_and_a_later_run_is_held_to_what_it_found(tmp_path: Path) -> None:
    """`hpctrain preflight` runs the check alone; a run whose node has since become 10x slower
    (debug.slow_node) is bad against that check (cluster.preflight.reference), though its own
    median cannot tell, and ends before any step."""
    first, host = tmp_path / "check", socket.gethostname()
    r = hpctrain("preflight", f"run.dir={first}", *BASE, "parallelism.engine=ddp", timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "pre-flight check of local" in r.stdout and host in r.stdout and "good" in r.stdout, r.stdout
    assert not (first / "steps-rank0.jsonl").exists() and not (first / "summary.json").exists()
    [check] = [json.loads(line) for line in (first / "preflight.json").read_text().splitlines()]
    assert check["precision"] == "fp32" and len(check["probes"]) == 2, check
    assert all(p["link_gbps"] > 0 for p in check["probes"])  # the ring over torch.distributed (DDP's Gloo)
    run_dir = tmp_path / "slow"
    r = hpctrain(
        "run", "--no-progress", f"run.dir={run_dir}", *BASE, "cluster.preflight.enabled=true",
        f"cluster.preflight.reference={first}", f"debug.slow_node={host}", "parallelism.engine=ddp", timeout=180,
    )  # fmt: skip
    assert r.returncode == 4, r.stdout + r.stderr
    assert f"PreflightFailed: pre-flight check: node(s) {host} bad: {host}: " in r.stderr, r.stderr
    assert f" in {first}, tolerance 0.5)" in r.stderr and f"cluster.exclude=[{host}]" in r.stderr, r.stderr
    assert not (run_dir / "steps-rank0.jsonl").exists()  # not one step on a bad node
    assert hpctrain("preflight", *BASE, "cluster.preflight.min_tflops=-1").returncode == 2


def test_dry_run_starts_nothing(tmp_path: Path) -> None:
    run_dir = tmp_path / "dry"
    r = hpctrain_here("run", "--dry-run", f"run.dir={run_dir}", "cluster.ranks=3")
    assert r.returncode == 0, r.stderr
    assert "mpirun -np 3" in r.stdout and "hpctrain.rank" in r.stdout
    assert "ranks: 3" in r.stdout  # the resolved config is printed too
    assert not run_dir.exists()


def test_invalid_config_exits_2_before_anything_starts(tmp_path: Path) -> None:
    r = hpctrain_here("run", f"run.dir={tmp_path / 'bad'}", "cluster.ranks=0", "train.global_batch=7")
    assert r.returncode == 2
    assert "cluster.ranks" in r.stderr and "fix:" in r.stderr
    assert not (tmp_path / "bad").exists()


def test_existing_run_dir_is_never_overwritten(tmp_path: Path) -> None:
    d = tmp_path / "used"
    d.mkdir()
    (d / "summary.json").write_text("{}")
    r = hpctrain("run", f"run.dir={d}", *BASE)
    assert r.returncode == 3 and "already exists" in r.stderr
    assert (d / "summary.json").read_text() == "{}"


def test_training_on_a_folder_of_images(tmp_path: Path) -> None:
    from tests.unit.test_folder_data import make_folder

    # dark "cat" images and bright "dog" images: learnable only if the labels are the sub-directories
    images = make_folder(tmp_path / "images", per_class=16)
    run_dir, s = run_ok(
        tmp_path,
        "folder",
        "data=folder",
        f"data.path={images}",
        "data.image_size=12",
        "data.num_classes=2",
        "data.num_workers=1",
        "train.batch_per_rank=8",
        "train.steps=30",
        "train.warmup_steps=1",
        "optim.lr=0.05",
        "train.save_model=false",
    )
    assert s["world_size"] == 2 and s["timed_steps"] == 29
    assert s["first_loss"] == pytest.approx(math.log(2), abs=0.15)  # 2 classes, before training
    assert s["last_loss"] < 0.2, s  # the classes were told apart: the images and labels were used
    assert not (run_dir / "model.pt").exists()  # train.save_model=false


def test_transformer_on_tokens_with_adamw(tmp_path: Path) -> None:
    _, s = run_ok(
        tmp_path,
        "lm",
        "model=transformer",
        "data=tokens",
        "optim=adamw",
        "model.width=32",
        "train.batch_per_rank=8",
        "train.steps=6",
        "train.warmup_steps=1",
        "optim.lr_scaling=linear",
        "optim.warmup_steps=3",
    )
    assert s["model"] == "transformer" and s["first_loss"] > 5.0  # ~ln(256) before training


def test_doctor_sees_the_real_environment() -> None:
    r = hpctrain("doctor")
    assert r.returncode == 0, r.stdout
    assert "MPI, Gloo" in r.stdout and "0.28.1" in r.stdout and "Open MPI" in r.stdout


def test_local_sweep_runs_every_point_and_tabulates(tmp_path: Path) -> None:
    r = hpctrain(
        "run",
        "-m",
        "--no-progress",
        "cluster.ranks=1,2",
        "precision=fp32,bf16",
        *BASE[:2],
        "train.steps=4",
        "train.warmup_steps=1",
        f"run.output_root={tmp_path}",
        "run.name=lsw",
    )
    assert r.returncode == 0, r.stdout + r.stderr
    [sweep] = list(tmp_path.glob("*/*-lsw-sweep"))
    worlds = [json.loads((sweep / str(i) / "summary.json").read_text())["world_size"] for i in range(4)]
    assert worlds == [1, 1, 2, 2]  # Hydra's order: the first override varies slowest
    assert r.stdout.count("COMPLETED") == 4


def test_logs_command_prints_a_local_rank_log(reference) -> None:
    run_dir, _ = reference  # DIGITS_CNN: 12 steps
    r = hpctrain("logs", str(run_dir), "--rank", "0")
    assert r.returncode == 0 and "step 12/12" in r.stdout
