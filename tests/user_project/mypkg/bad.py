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
