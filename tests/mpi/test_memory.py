"""Memory known before the queue, end to end: a point predicted not to fit the memory each rank has
is refused before anything exists, naming its prediction, the limit and the change that fits
(checked by the same prediction); on SLURM the limit is mem_gb over the ranks of a node and
nothing is submitted; `hpctrain bench memory-predict` holds a prediction against a real run."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hpctrain.analysis.memory import MiB, gib
from hpctrain.config.load import load_config
from tests.conftest import hpctrain

pytestmark = pytest.mark.mpi

MODEL = [
    "model=transformer",
    "model.width=256",
    "model.depth=4",
    "data=tokens",
    "optim.name=adamw",
    "train.batch_per_rank=8",
    "parallelism.engine=ddp",
]
LOCAL = [*MODEL, "cluster.ranks=2"]


def test_a_run_that_cannot_fit_is_refused_before_anything_exists_naming_the_change_that_fits(
    tmp_path: Path,
) -> None:
    from hpctrain.memory.predict import predict

    ddp = predict(load_config([*LOCAL, "parallelism=data"]), gpus=False).worst
    fsdp = predict(load_config([*LOCAL, "parallelism=fsdp"]), gpus=False).worst
    assert fsdp.peak < ddp.peak  # sharding holds less than every rank's replica and its buckets
    limit_gib = (ddp.peak + fsdp.peak) / 2 / 2**30
    run_dir = tmp_path / "run"
    r = hpctrain(
        "run",
        f"run.dir={run_dir}",
        *LOCAL,
        "parallelism=data",
        f"cluster.memory_per_rank_gib={limit_gib:.6f}",
    )
    assert r.returncode == 2, r.stdout + r.stderr
    assert not run_dir.exists()
    assert (
        f"cluster.memory_per_rank_gib: rank 0 is predicted to need {gib(ddp.peak)} (params "
        f"{gib(ddp.params)} + grads {gib(ddp.grads)} + optimizer {gib(ddp.optimizer)}" in r.stderr
    ), r.stderr
    assert f"more than the {gib(int(limit_gib * 2**30))} each rank has" in r.stderr, r.stderr
    assert "fix: parallelism=fsdp would fit (predicted the same way)" in r.stderr, r.stderr
    # with the limit the prediction meets, the run is not refused (a dry run: planned, not started)
    r = hpctrain(
        "run",
        "--dry-run",
        f"run.dir={run_dir}",
        *LOCAL,
        "parallelism=fsdp",
        f"cluster.memory_per_rank_gib={limit_gib:.6f}",
    )
    assert r.returncode == 0, r.stderr
    # nothing fits a rank of 1 MiB: the error says so rather than offer a change that does not fit
    r = hpctrain("run", f"run.dir={run_dir}", *LOCAL, "parallelism=fsdp", "cluster.memory_per_rank_gib=0.001")
    assert r.returncode == 2 and "use more ranks or a smaller model" in r.stderr, r.stderr
    assert not run_dir.exists()


def test_slurm_refuses_a_job_over_mem_gb_per_rank_before_submitting(tmp_path: Path) -> None:
    run_dir = tmp_path / "job"
    r = hpctrain(
        "run", f"run.dir={run_dir}", *MODEL, "parallelism=data", "cluster=slurm", "cluster.nodes=1",
        "cluster.ranks_per_node=2", "cluster.mem_gb=0.25",
    )  # fmt: skip
    assert r.returncode == 2, r.stdout + r.stderr
    assert re.search(r"cluster\.mem_gb: rank 0 is predicted to need .* more than the 128 MiB each rank has "
                     r"\(cluster\.mem_gb / cluster\.ranks_per_node\)", r.stderr), r.stderr  # fmt: skip
    assert not run_dir.exists()


def test_bench_memory_predict_holds_the_prediction_within_15_percent_of_the_run(tmp_path: Path) -> None:
    r = hpctrain(
        "bench", "memory-predict", "--cases", "fsdp", "--width", "256", "--depth", "4", "--batch", "8",
        "--steps", "3", "--out", str(tmp_path), timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    m = re.search(r"│ fsdp +│ +2 │(.*)│\s*$", r.stdout, re.M)
    assert m, r.stdout
    cells = [c.strip() for c in m[1].split("│")]
    predicted, measured, ratio = float(cells[-3]), float(cells[-2]), float(cells[-1].split()[0])
    [run] = list(tmp_path.glob("*/*-memory-predict/fsdp"))
    summary = (run / "summary.json").read_text()
    peak = max(int(x) for x in re.findall(r'"peak_memory_bytes": \[([^\]]*)\]', summary)[0].split(","))
    assert measured == round(peak / MiB)  # the measured column is the run's own record
    assert abs(ratio - predicted / measured) < 0.01 and 0.85 <= ratio <= 1.15, r.stdout
