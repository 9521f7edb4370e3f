"""Sharded data parallelism on real mpirun (FSDP2 over Gloo): fsdp and hsdp give the weights of
one rank with the whole batch (the check that would catch a sum-instead-of-average bug such as
pytorch/pytorch#162338), each rank holds its shard of the parameters, gradients and optimizer
state, and checkpoints move between world sizes and formats: fsdp on 4 ranks -> data on 1 rank
(Horovod) -> fsdp on 2 ranks, every resumed run ending on the one-rank weights."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from tests.conftest import MLP, assert_same_weights, flat, hpctrain, run_ok

pytestmark = pytest.mark.mpi

FSDP = ["parallelism=fsdp", *MLP, "train.batch_per_rank=null", "train.global_batch=32"]  # as one rank's


@pytest.fixture
def one_rank(mlp_one_rank: tuple[Path, dict]) -> tuple[Path, dict]:
    return mlp_one_rank


def assert_sharded_state(s: dict, full: dict, degree: int) -> None:
    """Every shard group holds the whole state once: parameters, gradients, optimizer state."""
    whole = full["per_rank"][0]
    for key in ("param_bytes", "grad_bytes", "optimizer_bytes"):
        held = [r[key] for r in s["per_rank"]]
        for g in range(len(held) // degree):
            assert sum(held[g * degree : (g + 1) * degree]) == whole[key], (key, held)
        assert max(held) <= whole[key] / degree * 1.25, (key, held)  # shards are balanced


@pytest.mark.parametrize(
    ("ranks", "extra", "degree"),
    [
        (2, ["parallelism.shard.reshard_after_forward=false"], 2),
        (
            4,
            [
                "parallelism=hsdp",
                "parallelism.shard.degree=2",
                "parallelism.backward_passes_per_step=2",
                "model.activation_checkpointing=true",
            ],
            2,
        ),
        (4, ["parallelism.shard.reshard_after_forward=2"], 4),
    ],
    ids=["fsdp2-keep-gathered", "hsdp2x2-accumulate-checkpointed", "fsdp4-reshard-to-2"],
)
def test_sharded_ranks_equal_one_rank(
    tmp_path: Path, one_rank: tuple[Path, dict], ranks: int, extra: list[str], degree: int
) -> None:
    run, s = run_ok(
        tmp_path,
        "sharded",
        *FSDP,
        f"cluster.ranks={ranks}",
        *extra,
    )
    assert_same_weights(one_rank[0], run, rtol=1e-5, atol=1e-6)
    assert s["world_size"] == ranks and flat(s)["shard_degree"] == degree
    assert s["parallelism"] == ("hsdp" if "parallelism=hsdp" in extra else "fsdp")
    assert_sharded_state(s, one_rank[1], degree)
    assert json.loads((run / "plan.json").read_text())["world_size"] == ranks


def resumed(tmp: Path, name: str, *overrides: str) -> tuple[Path, str]:
    run_dir = tmp / name
    r = hpctrain("run", "--no-progress", f"run.dir={run_dir}", *overrides)
    assert r.returncode == 0, r.stdout + r.stderr
    return run_dir, r.stdout


def test_checkpoints_move_between_world_sizes_and_formats(
    tmp_path: Path, one_rank: tuple[Path, dict]
) -> None:
    four, _ = run_ok(
        tmp_path,
        "four",
        *FSDP,
        "cluster.ranks=4",
        "cluster.checkpoint_interval=4",
    )
    dcp = four / "checkpoints" / "step-000004.dcp"
    assert sorted(p.name for p in dcp.iterdir()) == [".metadata", *(f"__{r}_0.distcp" for r in range(4))]
    assert (four / "checkpoints" / "latest").read_text().strip() == dcp.name

    # 4 sharded ranks -> 2 sharded ranks: DCP reshards as it reads
    two, out = resumed(
        tmp_path,
        "two",
        *FSDP,
        "cluster.ranks=2",
        f"train.resume_from={four}",
    )
    assert f"resuming from {dcp} at step 4 (written by 4 ranks, resharded to 2)" in out, out
    assert_same_weights(one_rank[0], two, rtol=1e-5, atol=1e-6)

    # 4 sharded ranks -> 1 rank of data parallelism under Horovod (read whole), which checkpoints again
    one, out = resumed(
        tmp_path,
        "one",
        *MLP,
        "cluster.ranks=1",
        "train.batch_per_rank=32",
        f"train.resume_from={dcp}",
        "cluster.checkpoint_interval=2",
    )
    assert "at step 4 (written by 4 ranks, resharded to 1)" in out, out
    assert_same_weights(one_rank[0], one, rtol=1e-5, atol=1e-6)

    # a whole checkpoint (Horovod's, step 6) -> 2 sharded ranks, sharded as it is read
    pt = one / "checkpoints" / "step-000006.pt"
    back, out = resumed(
        tmp_path,
        "back",
        *FSDP,
        "cluster.ranks=2",
        f"train.resume_from={pt}",
    )
    assert f"resuming from {pt} at step 6" in out, out
    assert_same_weights(one_rank[0], back, rtol=1e-5, atol=1e-6)
    assert json.loads((back / "summary.json").read_text())["timed_steps"] == 2  # steps 6 and 7


def test_a_study_compares_data_and_fsdp_state_per_rank(tmp_path: Path) -> None:
    """study.parallelisms: one series each, tensor-parallel layouts too (data/tp2: the model split
    over both ranks); the fsdp ranks hold half the state of the data ranks."""
    r = hpctrain(
        "study",
        "weak",
        "--no-progress",
        *MLP,
        "study.ranks=[2]",
        "study.repetitions=1",
        "study.steps=4",
        "study.warmup_steps=1",
        "study.allreduce_bench=false",
        "study.parallelisms=[data,fsdp,data/tp2]",
        "parallelism.engine=ddp",
        f"run.output_root={tmp_path}",
        "run.name=par",
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    [study] = list(tmp_path.glob("*/*-par-weak"))
    s = {p: json.loads((study / f"{p}-n2-r0" / "summary.json").read_text()) for p in ("data", "fsdp")}
    assert (s["data"]["parallelism"], s["fsdp"]["parallelism"]) == ("data", "fsdp")
    for key in ("param_bytes", "grad_bytes", "optimizer_bytes"):
        whole = s["data"]["per_rank"][0][key]
        assert sum(x[key] for x in s["fsdp"]["per_rank"]) == whole, key  # 2 shards of the same state
    tp = json.loads((study / "data-tp2-n2-r0" / "summary.json").read_text())
    assert (tp["parallelism"], flat(tp)["tp_degree"]) == ("data", 2) and flat(tp)["tp_messages"] == 3
    rows = list(csv.DictReader((study / "report" / "points.csv").open()))
    # layout, engine
    assert [row["series"] for row in rows] == ["data ddp", "fsdp ddp", "data tp=2 ddp"]


def test_a_failing_fsdp_rank_is_named_and_the_run_stops_at_that_step(tmp_path: Path) -> None:
    run_dir = tmp_path / "fail"
    r = hpctrain(
        "run",
        "--no-progress",
        f"run.dir={run_dir}",
        *FSDP,
        "cluster.ranks=2",
        "train.steps=400",
        "debug.fail_rank=1",
        "debug.fail_step=3",
        timeout=180,
    )
    assert r.returncode == 4, r.stderr
    assert "rank 1 failed: InjectedFailure: injected failure on rank 1 at step 3" in r.stderr, r.stderr
    assert json.loads((run_dir / "error-rank1.json").read_text())["type"] == "InjectedFailure"
    assert not (run_dir / "summary.json").exists()


def test_a_damaged_or_planted_sharded_checkpoint_falls_back_and_one_that_does_not_fit_is_named(
    tmp_path: Path,
) -> None:
    """Every rank agrees which checkpoint is usable: a truncated shard (one rank cannot read it) or a
    `.metadata` carrying code (refused, never run) makes the resume take the one before; a model of
    another width is refused naming the key, not with DCP's traceback."""
    import os
    import pickle
    import shutil

    base, _ = run_ok(
        tmp_path, "base", *FSDP, "cluster.ranks=2", "train.steps=6", "cluster.checkpoint_interval=2"
    )
    planted = tmp_path / "planted"
    shutil.copytree(base, planted)
    mark = tmp_path / "pwned"
    (planted / "checkpoints" / "step-000004.dcp" / ".metadata").write_bytes(
        pickle.dumps(type("P", (), {"__reduce__": lambda self: (os.system, (f"touch {mark}",))})())
    )
    damaged = base / "checkpoints" / "step-000004.dcp" / "__1_0.distcp"
    damaged.write_bytes(damaged.read_bytes()[:100])
    for src, why in [
        (base, "step-000004.dcp is unusable (rank 0: RuntimeError: PytorchStreamReader failed"),
        (planted, "step-000004.dcp was refused and not run: its .metadata holds posix.system"),
    ]:
        run_dir, out = resumed(
            tmp_path, f"from-{src.name}", *FSDP, "cluster.ranks=2", f"train.resume_from={src}"
        )
        assert why in out, out
        assert f"resuming from {src}/checkpoints/step-000002.dcp at step 2" in out, out
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["timed_steps"] == 8 - 2  # steps 2..7 of the 8
    assert not mark.exists()
    _, out = resumed(
        tmp_path,
        "done",
        *FSDP,
        "cluster.ranks=2",
        "train.steps=2",
        "train.warmup_steps=1",
        f"train.resume_from={base}",
    )
    assert "note: nothing left to train: the checkpoint is at step 2 and train.steps=2" in out, out

    r = hpctrain(
        "run",
        "--no-progress",
        f"run.dir={tmp_path / 'wide'}",
        *FSDP,
        "cluster.ranks=2",
        "model.width=64",
        f"train.resume_from={planted}",
    )
    assert r.returncode == 4, r.stdout + r.stderr
    assert (
        "step-000002.dcp does not fit this run: 'model.net.1.0.weight' has shape [32, 64] there and [64, 64] in this run"
        in r.stderr
    ), r.stderr
    assert "Traceback" not in r.stderr and "CheckpointException" not in r.stderr, r.stderr
