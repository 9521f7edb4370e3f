"""Tensor parallelism on real mpirun (torch.distributed.tensor.parallel over Gloo): pure TP, TP x
FSDP (2-D) and TP x HSDP give the weights of one rank with the whole batch, with and without
sequence parallelism; each rank holds its slice; checkpoints move across degrees and world sizes
(TP 2 x FSDP 2 on 4 ranks -> fsdp on 2 -> 1 rank), `model.pt` stays a plain full state dict."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpctrain.analysis.roofline import for_run
from hpctrain.parallel.tensor.figures import TensorFigures, TensorRank
from hpctrain.parallel.tensor.report import for_tensor_parallel
from hpctrain.records import RunSummary, read
from hpctrain.records.parts import part
from tests.conftest import MLP, TINY_LM, assert_same_weights, flat, hpctrain, run_ok

pytestmark = pytest.mark.mpi

TP2 = ["parallelism.engine=ddp", "parallelism.tp.degree=2"]
GLOBAL_32 = ["train.batch_per_rank=null", "train.global_batch=32"]  # as one rank's


@pytest.mark.parametrize(
    ("ranks", "extra", "shard"),
    [
        (2, TP2, 0),
        (4, ["parallelism=fsdp", "parallelism.tp.degree=2"], 2),
    ],
    ids=["tp2", "tp2-x-fsdp2"],
)
def test_a_tensor_parallel_mlp_equals_one_rank(
    tmp_path: Path, mlp_one_rank: tuple[Path, dict], ranks: int, extra: list[str], shard: int
) -> None:
    run, s = run_ok(tmp_path, "tp", *MLP, *GLOBAL_32, f"cluster.ranks={ranks}", *extra)
    assert_same_weights(mlp_one_rank[0], run, rtol=1e-5, atol=1e-6)
    assert (flat(s)["tp_degree"], flat(s)["shard_degree"], s["world_size"]) == (2, shard, ranks)
    whole = mlp_one_rank[1]["per_rank"][0]["param_bytes"]
    held = [r["param_bytes"] for r in s["per_rank"]]
    assert max(held) < whole, held  # each rank holds a slice of the split layers
    assert json.loads((run / "plan.json").read_text())["layout"]["tp"] == 2
    summary = read(run / "summary.json", RunSummary)
    roof = for_run(summary)  # the gradients' collectives: over the data-parallel ranks only
    if shard:
        assert roof is not None and roof.n == 2 and roof.grad_bytes == summary.grad_bytes / 2
    else:
        assert roof is None  # one replica: no gradient is averaged
    # TP's own collectives, counted: forward, the row-wise net.2.0 and net.4.0 all-reduce their
    # outputs; backward, the column-wise net.3.0 all-reduces its input's gradient (net.1.0's input
    # is the data: no gradient). Each b x 32 fp32 values, b = 32 / replicas samples.
    b = 32 // (ranks // 2)
    figures = part(summary, TensorFigures)
    assert (figures.messages, figures.bytes) == (3, 3 * b * 32 * 4), summary
    tp = for_tensor_parallel(summary)
    assert tp is not None and tp.messages == 3 and tp.expected_s > 0
    assert "tensor parallel: 3 collective(s) per step over 2 ranks" in tp.line()
    # ... and timed: the three messages sent again alone after training, on every rank. A step holds
    # them, so a replay is about a step's time at most; on a loaded 2-core machine one replay
    # once took 9.2 ms against an 8.5 ms mean step, so the bound is a few steps, not one
    assert all(0 < part(r, TensorRank).comm_s < 3 * summary.step_s for r in summary.per_rank), (
        summary.per_rank
    )
    assert tp.measured_s == figures.comm_s and "replayed alone" in tp.line()


@pytest.mark.parametrize(
    ("ranks", "extra"),
    [
        (2, [*TP2, "parallelism.tp.sequence_parallel=true"]),
        (4, ["parallelism=hsdp", "parallelism.shard.degree=1", "parallelism.tp.degree=2"]),
    ],
    ids=["tp2-sequence-parallel", "tp2-x-hsdp-2-replicas"],
)
def test_a_tensor_parallel_transformer_equals_one_rank(
    tmp_path: Path, lm_one_rank: tuple[Path, dict], ranks: int, extra: list[str]
) -> None:
    run, s = run_ok(tmp_path, "tp", *TINY_LM, *GLOBAL_32, f"cluster.ranks={ranks}", *extra)
    assert_same_weights(lm_one_rank[0], run, rtol=1e-5, atol=1e-6)
    assert flat(s)["tp_degree"] == 2 and s["last_loss"] == pytest.approx(
        lm_one_rank[1]["last_loss"], rel=1e-5
    )
    # sequence parallelism trades each all-reduce for an all-gather and a reduce-scatter: more
    # collectives, no fewer bytes on the wire (TINY_LM's 4 row-wise splits alone put 4 x b x 16 x 32
    # fp32 values through all-reduces forward)
    b = 32 // (ranks // 2)
    assert flat(s)["tp_messages"] >= 4 and flat(s)["tp_bytes"] >= 4 * b * 16 * 32 * 4, s
    assert all(r["tp_comm_s"] > 0 for r in flat(s)["per_rank"]), (
        s
    )  # all-gathers and reduce-scatters replay too


def test_checkpoints_move_across_tensor_parallel_degrees_and_world_sizes(
    tmp_path: Path, mlp_one_rank: tuple[Path, dict]
) -> None:
    """TP 2 x FSDP 2 on 4 ranks -> fsdp on 2 ranks -> data on 1 rank (Horovod), every resumed run
    ending on the one-rank weights; a whole model.pt throughout."""
    four, _ = run_ok(
        tmp_path,
        "four",
        *MLP,
        *GLOBAL_32,
        "cluster.ranks=4",
        "parallelism=fsdp",
        "parallelism.tp.degree=2",
        "cluster.checkpoint_interval=2",
    )
    dcp = four / "checkpoints" / "step-000006.dcp"
    assert (dcp / ".metadata").is_file()
    two = tmp_path / "two"
    r = hpctrain(
        "run",
        "--no-progress",
        f"run.dir={two}",
        *MLP,
        *GLOBAL_32,
        "cluster.ranks=2",
        "parallelism=fsdp",
        f"train.resume_from={tmp_path / 'four' / 'checkpoints' / 'step-000004.dcp'}",
        "cluster.checkpoint_interval=6",
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "at step 4 (written by 4 ranks, resharded to 2)" in r.stdout, r.stdout
    assert_same_weights(mlp_one_rank[0], two, rtol=1e-5, atol=1e-6)
    one = tmp_path / "one"
    r = hpctrain(
        "run",
        "--no-progress",
        f"run.dir={one}",
        *MLP,
        "cluster.ranks=1",
        "train.batch_per_rank=32",
        f"train.resume_from={two / 'checkpoints' / 'step-000006.dcp'}",
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "at step 6 (written by 2 ranks, resharded to 1)" in r.stdout, r.stdout
    assert_same_weights(mlp_one_rank[0], one, rtol=1e-5, atol=1e-6)
