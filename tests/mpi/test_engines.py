"""The two engines on real mpirun: torch DDP (Gloo) and Horovod average gradients to the same
weights as one rank with the whole batch, with and without accumulation; DDP's compression
hooks round within their precision; a failing DDP rank ends the run, named; and one engine's
settings are refused on the other."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.conftest import DIGITS_CNN as BASE
from tests.conftest import (
    assert_rank_1_failure_named,
    assert_same_weights,
    hpctrain,
    hpctrain_here,
    run_ok,
    weights,
)

pytestmark = pytest.mark.mpi

DDP = ["parallelism.engine=ddp", "cluster.ranks=2", "train.batch_per_rank=16"]


def test_ddp_two_ranks_equal_horovod_two_ranks_and_one_rank(
    tmp_path: Path, reference, one_rank_reference
) -> None:
    ddp, s = run_ok(tmp_path, "ddp", *BASE, *DDP)
    one, _ = one_rank_reference
    assert_same_weights(reference[0], ddp, rtol=1e-5, atol=1e-6)
    assert_same_weights(one, ddp, rtol=1e-5, atol=1e-6)
    assert s["engine"] == "ddp" and s["world_size"] == 2 and s["comm_s"] > 0
    # DDP's buckets (25 MiB) and its own all_reduce timed after training, for the roofline
    assert s["grad_bucket_bytes"] == 25 * 2**20 and s["probe_small_s"] > 0 and s["probe_full_s"] > 0
    env = json.loads((ddp / "env.json").read_text())
    assert env["engine"] == "ddp" and env["backend"] == "gloo"  # what torch.distributed runs on
    assert s["backend"] == "gloo"  # the summary says the same (it once gave Horovod's controller, mpi)
    assert json.loads((reference[0] / "env.json").read_text())["engine"] == "horovod"


def test_ddp_accumulation_with_no_sync_equals_the_full_batch(tmp_path: Path, reference) -> None:
    acc, _ = run_ok(tmp_path, "acc", *BASE, *DDP, "parallelism.backward_passes_per_step=4")
    assert_same_weights(reference[0], acc, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("codec, eps", [("fp16", 2.0**-11), ("bf16", 2.0**-8)])
def test_ddp_compression_hooks_round_the_gradients_within_their_precision(
    tmp_path: Path, reference, codec: str, eps: float
) -> None:
    """The gradients really travel compressed: the weights differ from the uncompressed run, by
    no more than that format's rounding of 12 steps of updates explains."""
    packed, _ = run_ok(tmp_path, codec, *BASE, *DDP, f"parallelism.compression={codec}")
    a, b = weights(reference[0]), weights(packed)
    assert any(not torch.equal(a[k], b[k]) for k in a)
    for k in a:
        # lr 0.05 x momentum sum over 12 steps (< 12 / (1 - 0.9)) x relative rounding x |grad| <= ~1
        assert (a[k] - b[k]).abs().max().item() < 0.05 * 120 * eps * 4, k


def test_a_failing_ddp_rank_ends_the_run_and_is_named(tmp_path: Path) -> None:
    # a DDP rank killed: test_local_runs.py's killed-rank test (the survivor's one-line message)
    assert_rank_1_failure_named(tmp_path, "exception", *BASE, *DDP)


@pytest.mark.parametrize(
    "overrides, rule",
    [
        (["parallelism.compression=bf16"], "parallelism.compression: bf16 compression is a DDP"),
        (["parallelism.bucket_mb=4"], "parallelism.bucket_mb: applies to engine=ddp only"),
        (["parallelism.engine=ddp", "parallelism.fusion_threshold_mb=8"], "applies to engine=horovod only"),
        (["parallelism.engine=ddp", "parallelism.bucket_mb=0"], "parallelism.bucket_mb: must be > 0"),
    ],
)
def test_one_engines_settings_are_refused_on_the_other(overrides: list[str], rule: str) -> None:
    r = hpctrain_here("run", "--dry-run", *overrides)
    assert r.returncode == 2 and rule in r.stderr, r.stderr


def test_a_user_model_trains_under_ddp_like_under_horovod(tmp_path: Path, user_project: Path) -> None:
    user = ["model._target_=mypkg.nets.TwoLayer", "data._target_=mypkg.data.blobs", "train.steps=8"]
    runs = {}
    for engine in ("horovod", "ddp"):
        runs[engine] = tmp_path / engine
        r = hpctrain(
            "run",
            "--no-progress",
            f"run.dir={runs[engine]}",
            *user,
            f"parallelism.engine={engine}",
            cwd=user_project,
        )
        assert r.returncode == 0, r.stdout + r.stderr
    assert_same_weights(runs["horovod"], runs["ddp"], rtol=1e-5, atol=1e-6)
