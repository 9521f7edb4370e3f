"""Context parallelism on real mpirun (parallel/context/): each sample's sequence split over two
ranks, attention seeing all of it through the all-gather of K and V, alone and composed on one
mesh with FSDP, tensor parallelism and a pipeline; each layout ends on one rank's weights (the
built-in transformer with its tied head, fp32, SGD, the whole batch of 32) and its checkpoint
resumes on one rank. The exchange is hand-counted: each attention call all-gathers K and V
(batch x local heads x 8 tokens x head_dim 8, fp32) from the other rank forward (again where its
block is recomputed) and reduce-scatters their gradients back, (N-1) x the local tensor's bytes
each collective."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import TINY_LM, assert_resumes_on_one_rank, assert_same_weights, hpctrain, run_ok

pytestmark = pytest.mark.mpi

GLOBAL_32 = ["train.batch_per_rank=null", "train.global_batch=32"]
CP2 = ["parallelism.cp.degree=2"]
FLOAT = 4


def kv(batch: int, heads: int) -> int:
    """Bytes one collective of K or V moves for a rank: the local (batch, heads, 8 of 16 tokens,
    head_dim 8) tensor's, from (all-gather) or to (reduce-scatter) the 1 other rank."""
    return 1 * batch * heads * 8 * 8 * FLOAT


# (overrides, ranks, the replicas' batch per K, local heads, collectives per step per rank): 2
# layers x K, V x (a gather and a scatter) = 8
LAYOUTS = {
    # the mission's engine: Horovod averages the gradients; the exchange goes over torch.distributed
    "cp2-horovod": (["parallelism.engine=horovod"], 2, 32, 4, 8),
    # blocks recomputed in the backward pass gather again there, as they did forward: 2 x 2 x 3
    "cp2-x-fsdp2-recompute": (["parallelism=fsdp", "parallelism.engine=ddp", "model.activation_checkpointing=true"], 4, 16, 4, 12),
    "cp2-x-tp2": (["parallelism=fsdp", "parallelism.engine=ddp", "parallelism.tp.degree=2"], 4, 32, 2, 8),
    # a stage holds one of the two layers; each of its 2 micro-batches of 8 exchanges K and V
    "pp2-x-cp2-x-fsdp2": (
        ["parallelism=fsdp", "parallelism.engine=ddp", "parallelism.stages=2", "parallelism.microbatches=2"],
        8, 8, 4, 8,
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_context_parallelism_equals_one_rank_and_resumes_on_one(
    tmp_path: Path, lm_one_rank: tuple[Path, dict], name: str
) -> None:
    extra, ranks, batch, heads, exchanges = LAYOUTS[name]
    run, s = run_ok(
        tmp_path, name, *TINY_LM, *GLOBAL_32, *extra, *CP2, f"cluster.ranks={ranks}", "cluster.checkpoint_interval=2"
    )  # fmt: skip
    assert_same_weights(lm_one_rank[0], run, rtol=1e-5, atol=1e-6)
    assert s["last_loss"] == pytest.approx(lm_one_rank[1]["last_loss"], rel=1e-5)  # the group's mean
    cp = s["parts"]["context"]
    assert (cp["degree"], cp["split_at"], cp["exchanges"]) == (2, "blocks.layers.0", exchanges), cp
    assert cp["kv_bytes"] == exchanges * kv(batch, heads), cp
    assert cp["comm_s"] > 0 and 0 < cp["share"] < 1, cp
    assert [r["parts"]["context"]["exchanges"] for r in s["per_rank"]] == [exchanges] * ranks
    # resumed at step 4 on one rank (a sharded checkpoint is resharded; a whole one read)
    (saved,) = (run / "checkpoints").glob("step-000004.*")
    assert_resumes_on_one_rank(tmp_path, saved, lm_one_rank[0], *TINY_LM)


MHA = """import torch
from torch import nn


class Lm(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(64, 16)
        self.attn = nn.MultiheadAttention(16, 2, batch_first=True)
        self.head = nn.Linear(16, 64)

    def forward(self, x):
        h = self.embed(x)
        return self.head(self.attn(h, h, h, need_weights=False)[0])


class LateBlock(nn.Module):
    # positions added inside the block, from the length of what it is given: with the sequence
    # split at it, each rank's tokens would get positions 0.. of its share

    def __init__(self):
        super().__init__()
        self.pos = nn.Parameter(torch.randn(16, 16))
        self.qkv = nn.Linear(16, 48)

    def forward(self, h):
        h = h + self.pos[: h.shape[1]]
        q, k, v = self.qkv(h).unflatten(-1, (3, 2, 8)).permute(2, 0, 3, 1, 4)
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return a.transpose(1, 2).flatten(2)


class LatePositions(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(64, 16)
        self.block = LateBlock()
        self.head = nn.Linear(16, 64)

    def forward(self, x):
        return self.head(self.block(self.embed(x)))
"""


@pytest.mark.parametrize(
    ("model", "said"),
    [
        # attention inside nn.MultiheadAttention: named when the rank wraps the model
        (["model._target_=mha_lm.Lm", "parallelism.cp.split_at=attn"],
         "attn computes attention without F.scaled_dot_product_attention"),
        # Hugging Face-style, with no attention at all: named before the first step
        (["model._target_=mypkg.gpt.CausalLM", "+model.vocab_size=64", "loss=model", "loss.targets_as=labels",
          "parallelism.cp.split_at=proj"], "nothing after 'proj' called F.scaled_dot_product_attention"),
        # positions from the local length: one sample's loss split is not the whole model's
        (["model._target_=mha_lm.LatePositions", "parallelism.cp.split_at=block"],
         "split over 2 ranks at 'block': something after it sees only this rank's share of the sequence"),
    ],
    ids=["multihead-attention", "no-sdpa", "positions-after-the-split"],
)  # fmt: skip
def test_a_model_whose_attention_is_not_sdpa_is_refused_naming_the_module(
    tmp_path: Path, model: list[str], said: str
) -> None:
    """The split sequence would attend to its own share only: the rank names the module and the
    fix instead of training something else than one rank would."""
    import subprocess

    from tests.conftest import make_user_project

    project = make_user_project(tmp_path)
    # a module of its own name: a worker that ran the user project in-process before has another
    # copy's mypkg imported already
    (project / "mha_lm.py").write_text(MHA)
    subprocess.run(["git", "-C", str(project), "add", "."], check=True)
    subprocess.run(
        [
            "git",
            "-C",
            str(project),
            "-c",
            "user.email=u@example.org",
            "-c",
            "user.name=u",
            "commit",
            "-qm",
            "mha",
        ],
        check=True,
    )
    r = hpctrain(
        "run", "--no-progress", f"run.dir={tmp_path / 'run'}", *model, "data=tokens", "data.vocab_size=64",
        "data.seq_len=16", "train.steps=2", "train.warmup_steps=1", *CP2, "cluster.ranks=2", "parallelism.engine=ddp",
        cwd=project,
    )  # fmt: skip
    out = r.stdout + r.stderr
    assert r.returncode != 0 and said in out, out
    assert "Traceback" not in out and "a bug in hpctrain" not in out, out
