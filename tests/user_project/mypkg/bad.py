"""Broken user code for the bad-input tests."""

import torch
from torch import nn


class Broken(nn.Module):
    def __init__(self, width: int = 4) -> None:
        super().__init__()
        raise ValueError("width must be even")


def wrong_shapes(n: int = 256) -> torch.utils.data.TensorDataset:
    """5 features, where mypkg.nets.TwoLayer takes 8."""
    return torch.utils.data.TensorDataset(torch.randn(n, 5), torch.randint(0, 3, (n,)))


class HangsOnRank1(nn.Module):
    """A constructor that never returns on rank 1 (a lock, a download that never ends)."""

    def __init__(self, width: int = 4) -> None:
        super().__init__()
        import os
        import time

        if os.environ.get("RANK", os.environ.get("OMPI_COMM_WORLD_RANK")) == "1":
            time.sleep(100000)  # hung in the constructor
        self.net = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)
