"""Real runs: hpctrain's CLI starts OpenMPI's mpirun, Horovod and PyTorch training.

Nothing here is faked or skipped: a missing mpirun or Horovod fails these tests.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

from tests.conftest import hpctrain

pytestmark = pytest.mark.mpi

# Real data (scikit-learn's digits), fp32, no shuffle surprises: a deterministic small run.
BASE = ["data=digits", "model=cnn", "train.steps=12", "train.warmup_steps=2", "train.log_interval=4"]


def run_ok(tmp: Path, name: str, *overrides: str) -> tuple[Path, dict]:
    run_dir = tmp / name
    r = hpctrain("run", "--no-progress", f"run.dir={run_dir}", *overrides)
    assert r.returncode == 0, f"exit {r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    return run_dir, json.loads((run_dir / "summary.json").read_text())


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / "model.pt", map_location="cpu")


def assert_same_weights(a: Path, b: Path, rtol: float, atol: float) -> None:
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=rtol, atol=atol, msg=lambda m: f"{k}: {m}")


def test_two_ranks_half_batch_equal_one_rank_full_batch(tmp_path: Path) -> None:
    """Gradients are averaged correctly: 2 x B/2 over Horovod == 1 x B, step for step."""
    one, s1 = run_ok(tmp_path, "one", *BASE, "cluster.ranks=1", "train.batch_per_rank=32")
    two, s2 = run_ok(tmp_path, "two", *BASE, "cluster.ranks=2", "train.batch_per_rank=16")
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


def test_gradient_accumulation_equals_the_full_batch(tmp_path: Path) -> None:
    full, _ = run_ok(tmp_path, "full", *BASE, "cluster.ranks=2", "train.batch_per_rank=16")
    acc, _ = run_ok(
        tmp_path,
        "acc",
        *BASE,
        "cluster.ranks=2",
        "train.batch_per_rank=16",
        "parallelism.backward_passes_per_step=4",
    )
    assert_same_weights(full, acc, rtol=1e-5, atol=1e-6)


def test_gloo_backend_trains_like_mpi(tmp_path: Path) -> None:
    mpi, _ = run_ok(tmp_path, "mpi", *BASE, "parallelism.backend=mpi")
    gloo, s = run_ok(tmp_path, "gloo", *BASE, "parallelism.backend=gloo")
    assert s["backend"] == "gloo"
    env = json.loads((gloo / "env.json").read_text())
    assert env["backend"] == "gloo" and env["horovod_build"]["gloo"]
    assert_same_weights(mpi, gloo, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
def test_every_precision_trains_and_loss_falls(tmp_path: Path, precision: str) -> None:
    _, s = run_ok(
        tmp_path,
        precision,
        "data=digits",
        f"precision={precision}",
        "train.steps=60",
        "train.warmup_steps=5",
        "train.batch_per_rank=32",
        "optim.lr=0.05",
    )
    assert s["precision"] == precision
    assert s["first_loss"] > 2.0  # ~ln(10) for 10 classes before training
    assert s["last_loss"] < 0.6 * s["first_loss"], s


def test_records_are_complete(tmp_path: Path) -> None:
    run_dir, s = run_ok(tmp_path, "rec", *BASE, "parallelism.compression=fp16")
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
    steps = [json.loads(line) for line in (run_dir / "steps-rank1.jsonl").read_text().splitlines()]
    assert [r["step"] for r in steps] == list(range(12))
    assert [r["timed"] for r in steps] == [False, False] + [True] * 10
    for r in steps:  # the split adds up: data + compute + comm is the whole step
        assert r["data_s"] + r["compute_s"] + r["comm_s"] == pytest.approx(r["step_s"], rel=1e-6)
    env = json.loads((run_dir / "env.json").read_text())
    assert env["horovod"] == "0.28.1" and env["horovod_build"]["mpi"]
    assert "Open MPI" in env["mpi_library"]
    assert len(env["hosts"]) == 2
    assert s["world_size"] == 2 and len(s["per_rank"]) == 2 and s["timed_steps"] == 10
    assert s["throughput_samples_per_s"] > 0
    assert 0 < s["compute_share"] <= 1 and 0 <= s["comm_share"] < 1


@pytest.mark.parametrize("mode,cause", [("exception", "InjectedFailure"), ("kill", "signal 9")])
def test_a_failing_rank_ends_the_run_promptly_and_is_named(tmp_path: Path, mode: str, cause: str) -> None:
    t0 = time.monotonic()
    r = hpctrain(
        "run",
        "--no-progress",
        f"run.dir={tmp_path / mode}",
        *BASE,
        "train.steps=400",
        "debug.fail_rank=1",
        "debug.fail_step=5",
        f"debug.fail_mode={mode}",
        timeout=180,
    )
    elapsed = time.monotonic() - t0
    assert r.returncode == 4, r.stderr
    assert "rank 1 failed" in r.stderr and cause in r.stderr, r.stderr
    # A guard against hangs, not a speed claim: 400 steps would take far longer than this.
    assert elapsed < 120
    assert not (tmp_path / mode / "summary.json").exists()


def test_dry_run_starts_nothing(tmp_path: Path) -> None:
    run_dir = tmp_path / "dry"
    r = hpctrain("run", "--dry-run", f"run.dir={run_dir}", "cluster.ranks=3")
    assert r.returncode == 0, r.stderr
    assert "mpirun -np 3" in r.stdout and "hpctrain.rank" in r.stdout
    assert "ranks: 3" in r.stdout  # the resolved config is printed too
    assert not run_dir.exists()


def test_invalid_config_exits_2_before_anything_starts(tmp_path: Path) -> None:
    r = hpctrain("run", f"run.dir={tmp_path / 'bad'}", "cluster.ranks=0", "train.global_batch=7")
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

    images = make_folder(tmp_path / "images", per_class=16)
    _, s = run_ok(
        tmp_path,
        "folder",
        "data=folder",
        f"data.path={images}",
        "data.image_size=12",
        "data.num_classes=2",
        "data.num_workers=1",
        "train.batch_per_rank=8",
        "train.steps=10",
        "train.warmup_steps=1",
    )
    assert s["world_size"] == 2 and s["timed_steps"] == 9


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


def test_logs_command_prints_a_local_rank_log(tmp_path: Path) -> None:
    run_dir, _ = run_ok(tmp_path, "logs", *BASE)
    r = hpctrain("logs", str(run_dir), "--rank", "0")
    assert r.returncode == 0 and "step 12/12" in r.stdout
