"""Tensor-parallel plans: which module of a model is split how (Megatron-LM's scheme, Shoeybi et
al. 2019, section 3): a column-wise Linear splits its output features (each rank a slice, no
communication), the row-wise Linear after it splits its input features and all-reduces its
output, so a pair costs one all-reduce forward and one backward. Pure: names only; the ranks
apply the plan with torch.distributed.tensor.parallel (split.py).

Styles, as parallelism.tp.plan spells them:
  colwise         Linear: output features split (or Embedding: embedding dimension split)
  rowwise         Linear: input features split, output all-reduced (Embedding: vocabulary split)
  colwise_gather  colwise, its output gathered whole (a head whose logits the loss reads)
  colwise_fused:K a Linear whose outputs are K equal matrices side by side (GPT-2's c_attn: q, k
                  and v, K=3): each is split by columns, so a rank holds its heads of each
A module whose forward reads a count or a width from an attribute (self.n_head, self.n_embd)
names it in parallelism.tp.divide: each rank's is divided by the degree (TorchTitan sets its
attention's local head count the same way).
With parallelism.tp.sequence_parallel (Korthikanti et al. 2022) the activations between the
split regions stay split along the sequence (dimension 1): a row-wise output is reduce-scattered
instead of all-reduced, and three more styles place the seams:
  sequence        a module that runs on its slice of the sequence (LayerNorm, dropout)
  gather_input    a region (attention, MLP) that all-gathers its input's sequence first
  split_output    a module whose whole output is cut along the sequence (the embeddings)
"""

from __future__ import annotations

import fnmatch

from hpctrain.config.schema import ModelConf

SPLITS = ("colwise", "rowwise", "colwise_gather")  # styles that split a Linear's or Embedding's weight
SEAMS = ("sequence", "gather_input", "split_output")  # sequence parallelism's
STYLES = SPLITS + SEAMS
FUSED = "colwise_fused"  # colwise_fused:K, K equal output matrices side by side


def fused_chunks(style: str) -> int | None:
    """K of a colwise_fused:K style (2 or more), or None for any other style or a malformed one."""
    name, sep, k = style.partition(":")
    if name != FUSED or not sep or not k.isdigit() or int(k) < 2:
        return None
    return int(k)


def is_style(style: str) -> bool:
    return style in STYLES or fused_chunks(style) is not None


def splits(style: str) -> bool:
    """Does the style split a Linear's (or Embedding's) weight?"""
    return style in SPLITS or fused_chunks(style) is not None


def declared_tp_plan(m: ModelConf, sequence: bool = False) -> dict[str, str]:
    """The built-in model's plan (empty: the model has none; user models name theirs)."""
    if m._target_:
        return {}
    if m.name == "transformer":
        seams = {
            "embed": "split_output",
            "blocks.layers.*.norm1": "sequence",
            "blocks.layers.*.attn": "gather_input",
            "blocks.layers.*.norm2": "sequence",
            "blocks.layers.*.ffn": "gather_input",
            "norm": "sequence",
        }
        return {
            **(seams if sequence else {}),
            **{
                "embed.tok": "rowwise",  # the vocabulary split; the looked-up rows all-reduced
                "blocks.layers.*.attn.wq": "colwise",  # each rank heads / tp of the heads
                "blocks.layers.*.attn.wk": "colwise",
                "blocks.layers.*.attn.wv": "colwise",
                "blocks.layers.*.attn.wo": "rowwise",
                "blocks.layers.*.ffn.w1": "colwise",
                "blocks.layers.*.ffn.w2": "rowwise",
                "head": "colwise_gather",  # the vocabulary's logits split, gathered for the loss
            },
        }
    if m.name == "mlp":
        # hidden layers net.1.0 .. net.<depth>.0, then the output layer net.<depth+1>: paired
        # column then row; an odd one out at the end stays whole on every rank
        linears = [f"net.{i}.0" for i in range(1, m.depth + 1)] + [f"net.{m.depth + 1}"]
        pairs = len(linears) // 2 * 2
        return {name: ("colwise", "rowwise")[i % 2] for i, name in enumerate(linears[:pairs])}
    return {}


def plan_for(m: ModelConf, given: dict[str, str], sequence: bool = False) -> dict[str, str]:
    """The plan in force: the user's (parallelism.tp.plan) if given, else the model's own."""
    return {str(k): str(v) for k, v in given.items()} if given else declared_tp_plan(m, sequence)


def resolve(plan: dict[str, str], names: list[str]) -> tuple[dict[str, str], list[str]]:
    """Each module name the plan's patterns match (fnmatch: `*` spans dots), with its style; and
    the patterns that matched nothing. A name matched by several patterns takes the first."""
    out: dict[str, str] = {}
    unmatched = []
    for pattern, style in plan.items():
        hits = [n for n in names if fnmatch.fnmatchcase(n, pattern)]
        if not hits:
            unmatched.append(pattern)
        for n in hits:
            out.setdefault(n, style)
    return out, unmatched
