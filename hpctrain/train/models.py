"""The model zoo: the sources' small CNN (the default), an MLP, ResNet-18/50 and a small transformer.

Every model maps a batch to logits whose last dimension is the number of classes; the loss is
cross-entropy over all leading positions, so images ([B] labels) and tokens ([B, T] labels) share
one training loop. No torchvision dependency: ResNets are written out below.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from hpctrain.config.schema import DataConf, ModelConf


@dataclass(frozen=True)
class InputSpec:
    """What the data looks like, so a model can size its first and last layers."""

    kind: str  # "image" or "tokens"
    channels: int = 0
    image_size: int = 0
    num_classes: int = 0
    seq_len: int = 0
    vocab_size: int = 0

    @classmethod
    def from_data(cls, data: DataConf) -> InputSpec:
        if data.name == "tokens":
            return cls(
                "tokens", seq_len=data.seq_len, vocab_size=data.vocab_size, num_classes=data.vocab_size
            )
        return cls("image", channels=data.channels, image_size=data.image_size, num_classes=data.num_classes)


class SmallCNN(nn.Module):
    """conv-relu-pool, conv-relu-pool, linear: the worked example of the sources."""

    def __init__(self, spec: InputSpec, width: int) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(spec.channels, width, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        side = spec.image_size // 4
        self.head = nn.Linear(2 * width * side * side, spec.num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(self.features(x), 1))


class MLP(nn.Module):
    def __init__(self, spec: InputSpec, width: int, depth: int) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Flatten()]
        fan_in = spec.channels * spec.image_size * spec.image_size
        for _ in range(
            depth
        ):  # one block per hidden layer: where pipelines cut, what checkpointing recomputes
            layers.append(nn.Sequential(nn.Linear(fan_in, width), nn.ReLU()))
            fan_in = width
        layers.append(nn.Linear(fan_in, spec.num_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, cin: int, planes: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut = _shortcut(cin, planes * self.expansion, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin: int, planes: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * self.expansion, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.shortcut = _shortcut(cin, planes * self.expansion, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        out = torch.relu(self.bn2(self.conv2(out)))
        return torch.relu(self.bn3(self.conv3(out)) + self.shortcut(x))


def _shortcut(cin: int, cout: int, stride: int) -> nn.Module:
    if stride == 1 and cin == cout:
        return nn.Identity()
    return nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))


class ResNet(nn.Module):
    """ResNet (He et al. 2016, arXiv:1512.03385). Small images (< 64 px) get the CIFAR stem."""

    def __init__(
        self, spec: InputSpec, block: type[BasicBlock] | type[Bottleneck], layers: list[int], width: int
    ) -> None:
        super().__init__()
        if spec.image_size >= 64:
            self.stem = nn.Sequential(
                nn.Conv2d(spec.channels, width, 7, 2, 3, bias=False),
                nn.BatchNorm2d(width),
                nn.ReLU(),
                nn.MaxPool2d(3, 2, 1),
            )
        else:
            self.stem = nn.Sequential(
                nn.Conv2d(spec.channels, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU()
            )
        stages: list[nn.Module] = []
        cin = width
        for i, n in enumerate(layers):
            planes = width * 2**i
            for j in range(n):
                stages.append(block(cin, planes, 2 if (i > 0 and j == 0) else 1))
                cin = planes * block.expansion
        self.stages = nn.Sequential(*stages)
        self.head = nn.Linear(cin, spec.num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stages(self.stem(x))
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


class Attention(nn.Module):
    """Causal multi-head self-attention with its projections as separate Linear modules, so tensor
    parallelism can split them (wq, wk, wv by columns: each rank a group of heads; wo by rows).
    The number of heads follows from the local width, so a rank holding heads / tp of them runs
    as it is (TorchTitan's attention does the same)."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.head_dim = width // heads
        self.wq = nn.Linear(width, width)
        self.wk = nn.Linear(width, width)
        self.wv = nn.Linear(width, width)
        self.wo = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t = x.shape[0], x.shape[1]
        q, k, v = (w(x).view(b, t, -1, self.head_dim).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(b, t, -1))


class FeedForward(nn.Module):
    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(width, hidden)
        self.w2 = nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(nn.functional.relu(self.w1(x)))


class Block(nn.Module):
    """A pre-norm transformer block (GPT-2's order): x + attn(norm(x)), then x + ffn(norm(x))."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(width)
        self.attn = Attention(width, heads)
        self.norm2 = nn.LayerNorm(width)
        self.ffn = FeedForward(width, 4 * width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.ffn(self.norm2(x))


class Blocks(nn.Module):
    def __init__(self, width: int, heads: int, depth: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Block(width, heads) for _ in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


class Embed(nn.Module):
    """Token plus learned position embeddings: one module, so that sequence parallelism can split
    its output along the sequence (train/tensor.py)."""

    def __init__(self, vocab: int, seq_len: int, width: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, width)
        self.pos = nn.Parameter(torch.zeros(1, seq_len, width))

    def reset_parameters(self) -> None:
        """What the constructor drew (nothing: positions start at zero), for a build on the meta
        device (train/materialize.py)."""
        nn.init.zeros_(self.pos)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.tok(tokens) + self.pos[:, : tokens.shape[1]]


class TinyTransformerLM(nn.Module):
    """A causal pre-norm transformer language model (GPT-style) for next-token prediction;
    `tie`: the head's weight is the token embedding's (GPT-2, Press & Wolf 2017)."""

    def __init__(self, spec: InputSpec, width: int, depth: int, heads: int, tie: bool = False) -> None:
        super().__init__()
        self.embed = Embed(spec.vocab_size, spec.seq_len, width)
        self.blocks = Blocks(width, heads, depth)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, spec.vocab_size, bias=False)
        if tie:
            self.head.weight = self.embed.tok.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.blocks(self.embed(tokens))))


def build_model(cfg: ModelConf, spec: InputSpec) -> nn.Module:
    """The model named by cfg.name; names and data kinds were checked by config validation."""
    if cfg.name == "cnn":
        return SmallCNN(spec, cfg.width)
    if cfg.name == "mlp":
        return MLP(spec, cfg.width, cfg.depth)
    if cfg.name == "resnet18":
        return ResNet(spec, BasicBlock, [2, 2, 2, 2], cfg.width)
    if cfg.name == "resnet50":
        return ResNet(spec, Bottleneck, [3, 4, 6, 3], cfg.width)
    if cfg.name == "transformer":
        return TinyTransformerLM(spec, cfg.width, cfg.depth, cfg.heads, cfg.tie_embeddings)
    raise ValueError(f"unknown model {cfg.name!r}")  # unreachable after validation
