"""Memory known before the queue, end to end: a point predicted not to fit the memory each rank has
is refused before anything exists, naming its prediction, the limit and the change that fits
(checked by the same prediction); on SLURM the limit is mem_gb over the ranks of a node and
nothing is submitted; `hpctrain bench memory-predict` holds a prediction against a real run."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from hpctrain.analysis.memory import MiB, gib, needed, parts_text
from hpctrain.config.load import load_config
from tests.conftest import hpctrain, run_ok

pytestmark = pytest.mark.mpi

# activations dominate (64 sequences of 64 tokens per rank through 4 small layers): checkpointing
# the blocks is the change that fits; the engine is DDP's, whose probe the other tests share
MODEL = [
    "model=transformer",
    "model.width=64",
    "model.depth=4",
    "model.heads=2",
    "data=tokens",
    "optim.name=adamw",
    "train.batch_per_rank=64",
    "parallelism=data",
    "parallelism.engine=ddp",
]
LOCAL = [*MODEL, "cluster.ranks=2"]
MLP = [
    "model=mlp",
    "model.width=1024",
    "model.depth=2",
    "optim.name=adamw",
    "parallelism=data",
    "parallelism.engine=ddp",
]


def test_a_run_that_cannot_fit_is_refused_before_anything_exists_naming_the_change_that_fits(
    tmp_path: Path,
) -> None:
    from hpctrain.memory.predict import predict

    plain = predict(load_config(LOCAL), gpus=False).worst
    recomputed = predict(load_config([*LOCAL, "model.activation_checkpointing=true"]), gpus=False).worst
    assert recomputed.activations < plain.activations / 2 and recomputed.params == plain.params
    # between what each needs with the prediction's error band (analysis/memory.py: MEMORY_BAND)
    limit_gib = (needed(plain) + needed(recomputed)) / 2 / 2**30
    run_dir = tmp_path / "run"
    r = hpctrain("run", f"run.dir={run_dir}", *LOCAL, f"cluster.memory_per_rank_gib={limit_gib:.6f}")
    assert r.returncode == 2, r.stdout + r.stderr
    assert not run_dir.exists()
    said = (
        f"cluster.memory_per_rank_gib: rank 0 is predicted to need {gib(plain.peak)} ({parts_text(plain)}), "
        f"{gib(needed(plain))} with the prediction's 15% error band"
    )
    assert said in r.stderr and f"activations {gib(plain.activations)}" in parts_text(plain), r.stderr
    assert f"more than the {gib(int(limit_gib * 2**30))} each rank has" in r.stderr, r.stderr
    assert "fix: model.activation_checkpointing=true would fit (predicted the same way)" in r.stderr, r.stderr
    # nothing fits a rank of 1 MiB: the error says so rather than offer a change that does not fit
    r = hpctrain("run", f"run.dir={run_dir}", *MLP, "cluster.ranks=2", "cluster.memory_per_rank_gib=0.001")
    assert r.returncode == 2 and "use more ranks or a smaller model" in r.stderr, r.stderr
    assert not run_dir.exists()


def test_slurm_refuses_a_job_over_mem_gb_per_rank_before_submitting(tmp_path: Path) -> None:
    run_dir = tmp_path / "job"
    r = hpctrain(
        "run", f"run.dir={run_dir}", *MLP, "cluster=slurm", "cluster.nodes=1",
        "cluster.ranks_per_node=2", "cluster.mem_gb=0.25",
    )  # fmt: skip
    assert r.returncode == 2, r.stdout + r.stderr
    assert re.search(r"cluster\.mem_gb: rank 0 is predicted to need .* more than the 128 MiB each rank has "
                     r"\(cluster\.mem_gb / cluster\.ranks_per_node\)", r.stderr), r.stderr  # fmt: skip
    assert not run_dir.exists()


def test_bench_memory_predict_holds_the_prediction_within_15_percent_of_the_run(tmp_path: Path) -> None:
    r = hpctrain(
        "bench", "memory-predict", "--cases", "ddp", "--width", "256", "--depth", "4", "--batch", "8",
        "--steps", "3", "--out", str(tmp_path), timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    m = re.search(r"│ ddp +│ +2 │(.*)│\s*$", r.stdout, re.M)
    assert m, r.stdout
    cells = [c.strip() for c in m[1].split("│")]
    predicted, measured, ratio = float(cells[-3]), float(cells[-2]), float(cells[-1].split()[0])
    [run] = list(tmp_path.glob("*/*-memory-predict/ddp"))
    summary = (run / "summary.json").read_text()
    peak = max(int(x) for x in re.findall(r'"peak_memory_bytes": \[([^\]]*)\]', summary)[0].split(","))
    assert measured == round(peak / MiB)  # the measured column is the run's own record
    assert abs(ratio - predicted / measured) < 0.01 and 0.85 <= ratio <= 1.15, r.stdout


def test_tune_leaves_out_a_value_that_cannot_fit() -> None:
    """DDP's buckets copy every gradient unless the gradients are views of them: with a limit
    between the two predictions, tune never tries gradient_as_bucket_view=false."""
    from hpctrain.memory.predict import predict

    mlp = [*MLP, "cluster.ranks=2"]
    view = predict(load_config([*mlp, "parallelism.gradient_as_bucket_view=true"]), gpus=False).worst
    copy = predict(load_config([*mlp, "parallelism.gradient_as_bucket_view=false"]), gpus=False).worst
    assert copy.buffers == view.params and view.buffers == 0  # the buckets: one copy of the gradients
    limit = f"cluster.memory_per_rank_gib={(needed(view) + needed(copy)) / 2 / 2**30:.6f}"
    keys = "tune.keys=[parallelism.gradient_as_bucket_view,parallelism.bucket_mb]"
    r = hpctrain("tune", "--dry-run", *mlp, "parallelism.gradient_as_bucket_view=true", keys, limit)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "parallelism.bucket_mb: 1, 5, 25, 100" in r.stdout, r.stdout
    assert (
        f"left out: parallelism.gradient_as_bucket_view=false: rank 0 is predicted to need {gib(copy.peak)}"
        in r.stdout
    ), r.stdout
    # the config as given, as --estimate shows it: its parts and what a rank has
    row = next(line for line in r.stdout.splitlines() if line.startswith("│ the config as given"))
    assert f"│ {gib(view.peak)} │" in row and "cluster.memory_per_rank_gib" in row and "yes" in row, row


def test_a_run_records_the_memory_check_it_passed_and_measures_itself_against_it(tmp_path: Path) -> None:
    run, s = run_ok(tmp_path, "fits", "model=mlp", "model.width=64", "train.steps=4", "train.warmup_steps=1",
                    "cluster.ranks=1", "cluster.memory_per_rank_gib=4")  # fmt: skip
    bound = json.loads((run / "plan.json").read_text())["memory"]
    assert bound["limit_bytes"] == 4 * 2**30 and bound["limit_key"] == "cluster.memory_per_rank_gib"
    assert bound["needed_bytes"] == int(bound["predicted_bytes"] * 1.15), bound  # the error band
    m = s["parts"]["memory"]
    assert m["measured_bytes"] == max(s["peak_memory_bytes"]) and not m["over_limit"], m
    assert m["measured_over_predicted"] == pytest.approx(m["measured_bytes"] / m["predicted_bytes"])
