"""Where the built-in models may be cut into pipeline stages, and which of their blocks activation
checkpointing recomputes. Pure: names follow from the model config, no model is built.

A split point is the name of a module (as in model.named_modules()) where a new stage begins;
torch.distributed.pipelining traces the model and cuts it there, whatever its forward does in
between. User models (_target_) name theirs in parallelism.split_at and model.checkpoint_blocks.
"""

from __future__ import annotations

from hpctrain.config.schema import Config, ModelConf

# ResNet blocks per stage (models.py builds the same lists)
RESNET_BLOCKS = {"resnet18": 8, "resnet50": 16}


def declared_split_points(m: ModelConf) -> list[str]:
    """Every place a built-in model can be cut, in forward order (empty for user models)."""
    if m._target_:
        return []
    if m.name == "cnn":
        return ["features.3", "head"]  # conv block 2, the classifier
    if m.name == "mlp":
        return [f"net.{i}" for i in range(2, m.depth + 2)]  # hidden blocks 2.., the output layer
    if m.name in RESNET_BLOCKS:
        return [f"stages.{i}" for i in range(1, RESNET_BLOCKS[m.name])] + ["head"]
    if m.name == "transformer":
        return [f"blocks.layers.{i}" for i in range(1, m.depth)] + ["norm"]
    return []


def declared_chain(m: ModelConf) -> list[str]:
    """The modules a built-in model runs one after the other, each on the one before's output
    (empty: the model is not such a chain). A pipeline whose stages are sharded or split by
    tensor parallelism is cut along it (parallel/pipeline/mesh.py): each piece holds real modules,
    which FSDP and tensor parallelism can take, where a traced piece holds a graph."""
    if m._target_:
        return []
    if m.name == "mlp":
        return [f"net.{i}" for i in range(m.depth + 2)]  # flatten, the hidden blocks, the output
    if m.name == "transformer":
        return ["embed", *(f"blocks.layers.{i}" for i in range(m.depth)), "norm", "head"]
    return []


def chain_pieces(chain: list[str], points: list[str]) -> list[list[str]]:
    """The chain cut where each split point begins a piece (every point is in the chain, in order)."""
    cuts = [0, *(chain.index(p) for p in points), len(chain)]
    return [chain[a:b] for a, b in zip(cuts, cuts[1:])]


def declared_checkpoint_blocks(m: ModelConf) -> list[str]:
    """The blocks activation checkpointing wraps: each keeps only its input for the backward pass."""
    if m._target_:
        return list(m.checkpoint_blocks)
    if m.name == "cnn":
        return ["features"]
    if m.name == "mlp":
        return [f"net.{i}" for i in range(1, m.depth + 1)]
    if m.name in RESNET_BLOCKS:
        return [f"stages.{i}" for i in range(RESNET_BLOCKS[m.name])]
    if m.name == "transformer":
        return [f"blocks.layers.{i}" for i in range(m.depth)]
    return []


def evenly(points: list[str], pieces: int) -> list[str]:
    """pieces - 1 of the candidate points, spread evenly over them (K candidates make K + 1
    segments; piece j ends after segment floor(j (K + 1) / pieces))."""
    k = len(points)
    return [points[j * (k + 1) // pieces - 1] for j in range(1, pieces)]


def split_points(cfg: Config, pieces: int) -> list[str]:
    """The split points used: parallelism.split_at as given, else the model's declared ones spread
    evenly. Validation has checked that there are enough."""
    given = list(cfg.parallelism.split_at)
    return given if given else evenly(declared_split_points(cfg.model), pieces)


def units_within(m: ModelConf, given: list[str], names: set[str]) -> list[str]:
    """The shard units (shard_units) among `names`: those of one pipeline piece."""
    return [u for u in shard_units(m, given) if u in names]


def shard_units(m: ModelConf, given: list[str]) -> list[str]:
    """What FSDP shards as units (each all-gathered on its own): parallelism.shard.modules as
    given (module or class names), else a built-in model's blocks, the ones activation
    checkpointing wraps (a user model without names is one unit)."""
    return given if given else declared_checkpoint_blocks(m) if not m._target_ else []
