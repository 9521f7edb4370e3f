"""Datasets and the sharded, deterministic batch order.

Every rank draws the same seeded permutation of the dataset; step s uses the global batch
perm[s*G:(s+1)*G] and rank r takes its contiguous slice [r*b:(r+1)*b]. So N ranks with per-rank
batch G/N see, together, exactly the samples one rank with batch G sees: data-parallel training
is then mathematically the same as single-process training (the equivalence test relies on it).
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler, TensorDataset

from hpctrain.config.folder import IMAGE_SUFFIXES  # one list for validation and the ranks
from hpctrain.config.options import DIGITS_TRAIN
from hpctrain.config.schema import DataConf


class GlobalBatchSampler(Sampler[list[int]]):
    """Yields this rank's index list for each step, for `steps` steps (epochs wrap around)."""

    def __init__(
        self,
        n: int,
        global_batch: int,
        rank: int,
        per_rank: int,
        steps: int,
        seed: int,
        shuffle: bool,
        start_step: int = 0,
    ) -> None:
        if global_batch > n:
            raise ValueError(f"global batch {global_batch} is larger than the dataset ({n})")
        self.n, self.g, self.rank, self.b = n, global_batch, rank, per_rank
        self.steps, self.seed, self.shuffle, self.start = steps, seed, shuffle, start_step
        self.per_epoch = n // global_batch  # the last partial global batch is dropped

    def _order(self, epoch: int) -> torch.Tensor:
        if not self.shuffle:
            return torch.arange(self.n)
        gen = torch.Generator().manual_seed(self.seed * 100_003 + epoch)
        return torch.randperm(self.n, generator=gen)

    def __iter__(self) -> Iterator[list[int]]:
        epoch, order = -1, torch.empty(0, dtype=torch.long)
        for step in range(self.start, self.steps):
            e, k = divmod(step, self.per_epoch)
            if e != epoch:
                epoch, order = e, self._order(e)
            lo = k * self.g + self.rank * self.b
            yield order[lo : lo + self.b].tolist()

    def __len__(self) -> int:
        return self.steps - self.start


def synthetic_images(cfg: DataConf, seed: int) -> TensorDataset:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(cfg.num_samples, cfg.channels, cfg.image_size, cfg.image_size, generator=gen)
    y = torch.randint(0, cfg.num_classes, (cfg.num_samples,), generator=gen)
    return TensorDataset(x, y)


def synthetic_tokens(cfg: DataConf, seed: int) -> TensorDataset:
    gen = torch.Generator().manual_seed(seed)
    seq = torch.randint(0, cfg.vocab_size, (cfg.num_samples, cfg.seq_len + 1), generator=gen)
    return TensorDataset(seq[:, :-1].contiguous(), seq[:, 1:].contiguous())


def digits(part: str = "train") -> TensorDataset:
    """scikit-learn's 8x8 digits (shipped with the package), standardised, as 1x8x8 images: the
    training part, or the held-out part ("test"), split by one fixed shuffle whatever train.seed is.
    Read from the package's data file as sklearn.datasets.load_digits reads it, without importing
    scikit-learn (1.5-2 s of CPU in every rank of every run)."""
    table = _digits_table()
    x = torch.tensor(table[:, :-1].reshape(-1, 1, 8, 8), dtype=torch.float32)
    x = (x - x.mean()) / x.std()
    y = torch.tensor(table[:, -1].astype(np.int64), dtype=torch.long)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    keep = order[:DIGITS_TRAIN] if part == "train" else order[DIGITS_TRAIN:]
    return TensorDataset(x[keep], y[keep])


@functools.cache
def _digits_table() -> np.ndarray:
    """The data file, parsed once per process (rank 0 reads both parts)."""
    spec = importlib.util.find_spec("sklearn")  # finds the package without running it
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError("data=digits needs scikit-learn (pip install scikit-learn)")
    return np.loadtxt(Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz", delimiter=",")


def holds_out(cfg: DataConf) -> bool:
    """Whether the data keeps samples the run never trains on (built-in digits alone): every rank
    asks, since measuring the accuracy on them gathers the model."""
    return cfg._target_ is None and cfg.name == "digits"


def held_out(cfg: DataConf) -> TensorDataset:
    """The samples the run never trains on, for the accuracy at its end (rank 0 alone loads them)."""
    return digits("test")


class ImageFolder(Dataset[tuple[torch.Tensor, int]]):
    """root/<class>/<image>: classes are the sorted sub-directory names, as in torchvision."""

    def __init__(self, root: str, channels: int, size: int) -> None:
        base = Path(root)
        self.classes = sorted(p.name for p in base.iterdir() if p.is_dir())
        self.items = [
            (f, i)
            for i, c in enumerate(self.classes)
            for f in sorted((base / c).iterdir())
            if f.suffix.lower() in IMAGE_SUFFIXES
        ]
        if not self.items:
            raise FileNotFoundError(f"no images under {root} (expected {root}/<class>/<image>)")
        self.mode = {1: "L", 3: "RGB", 4: "RGBA"}[channels]
        self.size = size

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        from PIL import Image

        path, label = self.items[i]
        with Image.open(path) as im:
            arr = np.asarray(im.convert(self.mode).resize((self.size, self.size)), np.float32)
        t = torch.from_numpy(arr.reshape(self.size, self.size, -1)).permute(2, 0, 1) / 255.0
        return (t - 0.5) / 0.5, label


def build_dataset(cfg: DataConf, seed: int) -> Dataset:
    # Synthetic data depends only on the seed, never on the rank: all ranks hold the same samples.
    if cfg.name == "synthetic":
        return synthetic_images(cfg, seed)
    if cfg.name == "tokens":
        return synthetic_tokens(cfg, seed)
    if cfg.name == "digits":
        return digits()
    if cfg.name == "folder":
        folder = ImageFolder(str(cfg.path), cfg.channels, cfg.image_size)
        if len(folder.classes) > cfg.num_classes:  # validated at launch; the data may have changed since
            raise ValueError(
                f"{cfg.path} has {len(folder.classes)} class directories, but data.num_classes="
                f"{cfg.num_classes}: set data.num_classes={len(folder.classes)}"
            )
        return folder
    raise ValueError(f"unknown dataset {cfg.name!r}")  # unreachable after validation


def build_loader(cfg: DataConf, dataset: Dataset, sampler: GlobalBatchSampler) -> DataLoader:
    extra: dict[str, Any] = {}
    if cfg.num_workers > 0:
        extra = {"prefetch_factor": cfg.prefetch_factor, "persistent_workers": True}
    return DataLoader(
        dataset, batch_sampler=sampler, num_workers=cfg.num_workers, pin_memory=cfg.pin_memory, **extra
    )
