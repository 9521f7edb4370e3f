import torch
from torch.utils.data import TensorDataset


def blobs(n: int = 512, features: int = 8, classes: int = 3, seed: int = 1) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, classes, (n,), generator=g)
    centres = torch.randn(classes, features, generator=g) * 3
    return TensorDataset(centres[y] + torch.randn(n, features, generator=g), y)
