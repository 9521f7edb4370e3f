"""What the README promises about the command line, exercised for real: exit statuses, the
interrupt contract, sweeps with a failed or an invalid point, --cfg / --dry-run, doctor's
failure branches, the world-size check and the bench commands (smoke tests, no timing)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import (
    ROOT,
    hpctrain,
    hpctrain_here,
    lines,
    start_hpctrain,
    wait_for,
    wait_until_gone,
)

pytestmark = pytest.mark.mpi

SMALL = ["data=digits", "train.steps=6", "train.warmup_steps=1", "train.batch_per_rank=16"]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_an_interrupted_run_exits_130_and_leaves_nothing_running(tmp_path: Path, sig: signal.Signals) -> None:
    run_dir = tmp_path / "long"
    proc = start_hpctrain(
        "run",
        "--no-progress",
        f"run.dir={run_dir}",
        *SMALL[:1],
        "train.steps=100000",
        "train.log_interval=1000",
    )
    try:
        wait_for("20 steps", lambda: lines(run_dir / "steps-rank0.jsonl") >= 20)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, out + err
    assert err.strip().splitlines()[-1] == "interrupted", err
    wait_until_gone(run_dir)
    state = json.loads((run_dir / "state.json").read_text())
    assert state["state"] == "CANCELLED"
    done = lines(run_dir / "steps-rank0.jsonl")
    assert 20 <= done < 100000 and not (run_dir / "summary.json").exists()


@pytest.mark.parametrize(
    "how", [["cluster.mpirun=/nonexistent/mpirun"], ["cluster.mpirun=hpctrain-no-such-mpirun"]]
)
def test_a_missing_mpirun_is_a_launch_error_exit_3(tmp_path: Path, how: list[str]) -> None:
    r = hpctrain("run", f"run.dir={tmp_path / 'r'}", *SMALL, *how)
    assert r.returncode == 3, r.stdout + r.stderr
    assert "not found" in r.stderr and "apt-get install openmpi-bin" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_doctor_without_mpirun_fails_and_shows_the_fix(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"  # a PATH with everything doctor runs except OpenMPI
    bin_dir.mkdir()
    for tool in ("sbatch", "srun", "squeue", "sacct", "scancel", "sinfo", "apt-get"):  # apt-get: root's fix
        if shutil.which(tool):
            (bin_dir / tool).symlink_to(shutil.which(tool))
    env = dict(os.environ, PATH=str(bin_dir), COLUMNS="200", TERM="dumb")
    r = subprocess.run(
        [sys.executable, "-m", "hpctrain.cli", "doctor"], capture_output=True, text=True, env=env, cwd=ROOT
    )
    assert r.returncode == 1, r.stdout + r.stderr
    row = next(line for line in r.stdout.splitlines() if "mpirun" in line)
    assert "missing" in row and "not found" in row and "apt-get install openmpi-bin" in row, r.stdout
    assert "1 required component(s) missing" in r.stdout


def test_a_sweep_with_a_failed_point_runs_the_others_and_exits_4(tmp_path: Path) -> None:
    r = hpctrain(
        "run",
        "-m",
        "--no-progress",
        *SMALL,
        "debug.fail_step=2",
        "debug.fail_rank=null,1",
        f"run.output_root={tmp_path}",
        "run.name=fp",
        timeout=300,
    )
    assert r.returncode == 4, r.stdout + r.stderr
    [sweep] = list(tmp_path.glob("*/*-fp-sweep"))
    assert (sweep / "0" / "summary.json").exists() and not (sweep / "1" / "summary.json").exists()
    assert r.stdout.count("COMPLETED") == 1 and r.stdout.count("FAILED") == 1, r.stdout
    assert "InjectedFailure" in r.stdout + r.stderr
    # the table compares the points by what they learnt too: the completed one's last loss
    last = json.loads((sweep / "0" / "summary.json").read_text())["last_loss"]
    assert "loss, last 5 steps" in r.stdout and f"{last:.4f}" in r.stdout, r.stdout


def test_one_invalid_point_stops_the_whole_sweep_before_any_launch(tmp_path: Path) -> None:
    r = hpctrain_here(
        "run", "-m", *SMALL, "cluster.ranks=1,2,0", f"run.output_root={tmp_path}", "run.name=bad"
    )
    assert r.returncode == 2, r.stdout + r.stderr
    assert "cluster.ranks: must be >= 1 (got 0)" in r.stderr, r.stderr
    assert "in: point 2 (cluster.ranks=0)" in r.stderr, r.stderr  # names the point, not the others
    assert not list(tmp_path.iterdir())  # not even the valid points' directories


def test_one_invalid_point_stops_the_whole_study_before_any_launch(tmp_path: Path) -> None:
    # 32 samples do not split over 3 ranks: the n3 point is invalid, n1 and n2 are fine
    r = hpctrain_here(
        "study",
        "strong",
        "study.ranks=[1,2,3]",
        "study.global_batch=32",
        "study.steps=4",
        "study.warmup_steps=1",
        "data=digits",
        f"run.output_root={tmp_path}",
    )
    assert r.returncode == 2, r.stdout + r.stderr
    assert "train.global_batch: 32 is not divisible by the world size 3" in r.stderr, r.stderr
    assert "in: n3-r0" in r.stderr and "n2-r0" not in r.stderr, r.stderr
    assert not list(tmp_path.iterdir())


def test_cfg_prints_the_resolved_config_and_starts_nothing(tmp_path: Path) -> None:
    r = hpctrain_here("run", "--cfg", f"run.dir={tmp_path / 'c'}", "cluster.ranks=3", "precision=bf16")
    assert r.returncode == 0, r.stderr
    assert "ranks: 3" in r.stdout and "name: bf16" in r.stdout
    assert "mpirun" not in r.stdout.replace("mpirun: mpirun", "")  # the config only, not the plan
    assert not (tmp_path / "c").exists()


def test_study_dry_run_lists_every_point_and_starts_nothing(tmp_path: Path) -> None:
    r = hpctrain_here(
        "study",
        "weak",
        "--dry-run",
        "study.ranks=[1,2]",
        "study.repetitions=2",
        "study.batch_per_rank=8",
        f"run.output_root={tmp_path}",
    )
    assert r.returncode == 0, r.stderr
    for name in ("n1-r0", "n1-r1", "n2-r0", "n2-r1"):
        assert name in r.stdout, r.stdout
    assert "train.batch_per_rank=8" in r.stdout
    assert not list(tmp_path.iterdir())


def test_a_rank_started_outside_the_plan_refuses_to_train_alone(
    tmp_path: Path, reference: tuple[Path, dict]
) -> None:
    """The plan says 2 ranks; one process started by a bare `mpirun -np 1` would otherwise train
    alone as rank 0 of 1. It stops with the world-size mismatch instead."""
    planned = reference[0]
    alone = tmp_path / "alone"
    alone.mkdir()
    for name in ("config.yaml", "plan.json"):
        shutil.copy(planned / name, alone / name)
    mpirun = ["mpirun", "--allow-run-as-root", "-np", "1", sys.executable, "-m", "hpctrain.rank", str(alone)]
    r = subprocess.run(mpirun, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode != 0
    err = json.loads((alone / "error-rank0.json").read_text())
    assert "Horovod sees a world of 1 rank(s) but the plan has 2" in err["message"], err
    assert not (alone / "steps-rank0.jsonl").exists()


def test_bench_analyze_runs_end_to_end() -> None:
    r = hpctrain("bench", "analyze", "--runs", "40", "80", timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = re.findall(r"^\s*│ +(40|80) │ +([0-9.]+) │ +([0-9.]+) │", r.stdout, re.M)
    assert [n for n, _, _ in rows] == ["40", "80"], r.stdout  # both sizes, first analysis and again
    assert re.search(r"growth from 40 to 80 runs, t ~ n\^k: first analysis k = -?[0-9.]+", r.stdout), r.stdout
    # the analysis recovers the synthetic engine's latency (2 ms) and exposed share (0.5)
    m = re.search(
        r"fitted engine latency ([0-9.]+) ms and exposed share ([0-9.]+) \(generated with 2 ms and 0.5\)",
        r.stdout,
    )
    assert m and abs(float(m[1]) - 2) < 0.1 and abs(float(m[2]) - 0.5) < 0.03, r.stdout


def test_bench_allreduce_runs_end_to_end(tmp_path: Path) -> None:
    r = hpctrain("bench", "allreduce", "--ranks", "2", "--max-mb", "1", "--out", str(tmp_path), timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "hvd busbw" in r.stdout and "alpha-beta fit (Horovod)" in r.stdout, r.stdout
    [out] = list(tmp_path.glob("*/*-allreduce/allreduce-n2.json"))
    rows = json.loads(out.read_text())["rows"]
    assert [row["bytes"] for row in rows] == [2**k for k in range(10, 21)]  # 1 KiB .. 1 MiB
    assert all(row["hvd_s"] > 0 and row["mpi_s"] > 0 and row["torch_s"] > 0 for row in rows)
    # FSDP's collectives beside them: torch.distributed's all-gather and reduce-scatter
    assert all(0 < row["allgather_s"] < 10 and 0 < row["reduce_scatter_s"] < 10 for row in rows), rows
    assert "all-gather" in r.stdout and "ag busbw" in r.stdout and "rs busbw" in r.stdout, r.stdout


def test_bench_pipeline_runs_end_to_end(tmp_path: Path) -> None:
    """Two small runs: the table has every part for both, and the lines on the targets and the
    predicted best micro-batch count follow."""
    r = hpctrain(
        "bench", "pipeline", "--batch", "64", "--steps", "3", "--width", "32", "--depth", "4",
        "--microbatches", "1", "2", "--schedules", "gpipe", "--out", str(tmp_path), timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    rows = re.findall(r"^\s*│ +gpipe │ ([12]) │(.*)$", r.stdout, re.M)
    assert [m for m, _ in rows] == ["1", "2"], r.stdout
    cells = [c.strip() for c in rows[1][1].split("│")]
    assert cells[3] == "33.3%" and re.fullmatch(r"[+-][0-9.]+%", cells[-4]), cells  # theory at m=2
    assert "gpipe m=2: " in r.stdout and "x m=1's throughput" in r.stdout, r.stdout
    assert re.search(r"gpipe: the model \(from m=2\) predicts m=[12] fastest", r.stdout), r.stdout
    assert len(list(tmp_path.glob("*/*-pipeline/gpipe-m*/summary.json"))) == 2


def test_bench_overhead_runs_end_to_end(tmp_path: Path) -> None:
    r = hpctrain(
        "bench",
        "overhead",
        "--ranks",
        "1",  # every contender's whole path at one rank start each (2 ranks cost 14 CPU-s more)
        "--repeats",
        "1",
        "--steps",
        "8",
        "--batch",
        "16",
        "--out",
        str(tmp_path),
        timeout=600,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    for label in (
        "hpctrain's faster engine / ceiling",
        "hpctrain horovod / minimal horovod",
        "hpctrain ddp / minimal ddp",
    ):
        ratio = float(r.stdout.split(f"{label} = ")[1].split()[0])
        assert ratio > 0  # a figure for the note, never a timing assertion
    runs = sorted(p.parent.name for p in tmp_path.glob("*/*-overhead/*/summary.json"))
    assert runs == ["hpctrain-ddp-0", "hpctrain-horovod-0"], r.stdout
    for contender in ("ceiling", "minimal horovod", "minimal ddp"):
        assert contender in r.stdout
