"""A model as you would write it: an nn.Module whose forward takes a batch of inputs and returns
logits, `[B, classes]` for `[B]` targets (loss=cross_entropy, hpctrain's default)."""

from torch import nn


class Mlp(nn.Module):
    def __init__(self, features: int = 2, hidden: int = 32, classes: int = 4) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(features, hidden),
            nn.Tanh(),
            nn.Linear(hidden, hidden),
            nn.Tanh(),
            nn.Linear(hidden, classes),
        )

    def forward(self, x):
        return self.layers(x)
