"""A dataset as you would write it: a map-style torch Dataset of (input, target) pairs. hpctrain
shards it over the ranks exactly as its own (N ranks see together what one rank sees)."""

import torch
from torch.utils.data import TensorDataset


def blobs(n: int = 1024, classes: int = 4, spread: float = 0.5, seed: int = 0) -> TensorDataset:
    """`n` points in the plane around `classes` centres on the unit circle; the class is the centre."""
    g = torch.Generator().manual_seed(seed)
    label = torch.arange(n) % classes
    angle = 2 * torch.pi * label / classes
    centre = torch.stack([torch.cos(angle), torch.sin(angle)], dim=1)
    return TensorDataset(centre + spread * torch.randn(n, 2, generator=g), label)
