"""The loader for a user's own images (ImageFolder layout), on real PNG files made here."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from hpctrain.train.data import ImageFolder


def make_folder(root: Path, per_class: int = 4, size: int = 12) -> Path:
    rng = np.random.default_rng(0)
    for c, name in enumerate(["cat", "dog"]):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            arr = np.full((size, size, 3), 40 + 150 * c, np.uint8) + rng.integers(
                0, 20, (size, size, 3), dtype=np.uint8
            )
            Image.fromarray(arr).save(root / name / f"{i}.png")
        (root / name / "notes.txt").write_text("not an image")
    return root


def test_classes_are_sorted_subdirectories_and_images_are_resized(tmp_path: Path) -> None:
    ds = ImageFolder(str(make_folder(tmp_path)), channels=3, size=8)
    assert ds.classes == ["cat", "dog"] and len(ds) == 8
    x, y = ds[5]
    assert x.shape == (3, 8, 8) and y == 1 and x.dtype == torch.float32
    assert -1.0 <= float(x.min()) and float(x.max()) <= 1.0
    assert float(ds[0][0].mean()) < float(ds[5][0].mean())  # dark cats, bright dogs


def test_greyscale_conversion(tmp_path: Path) -> None:
    assert ImageFolder(str(make_folder(tmp_path)), channels=1, size=6)[0][0].shape == (1, 6, 6)


def test_empty_folder_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    with pytest.raises(FileNotFoundError, match="no images"):
        ImageFolder(str(tmp_path), 3, 8)
