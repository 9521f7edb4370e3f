import torch
from torch import nn


class TwoLayer(nn.Module):
    def __init__(self, features: int = 8, hidden: int = 16, classes: int = 3) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(features, hidden), nn.Tanh(), nn.Linear(hidden, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class BatchNormed(nn.Module):
    """A classifier with BatchNorm between its layers: running statistics are buffers, updated in
    every training forward, and its normalisation depends on the batch it sees."""

    def __init__(self, features: int = 8, hidden: int = 16, classes: int = 3) -> None:
        super().__init__()
        self.inp = nn.Linear(features, hidden)
        self.norm = nn.BatchNorm1d(hidden)
        self.out = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.norm(self.inp(x))))
