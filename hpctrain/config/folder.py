"""data=folder: the image folder read once at validation, as the ranks will read it (torchvision's
ImageFolder layout, root/<class>/<image>), so an empty, flat or image-less folder, or one with too
few images for the ranks, stops before anything starts."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from hpctrain.config.schema import DataConf
from hpctrain.errors import Problem

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp")
LAYOUT = "one sub-directory of images per class (data.path/<class>/<image>)"


@dataclass
class Survey:
    classes: list[str] = field(default_factory=list)
    images: int = 0  # in the class directories: what the ranks train on
    top_images: int = 0  # directly in data.path: a flat folder
    other_files: int = 0  # in the class directories, without an image suffix (skipped)
    error: str = ""


def survey(path: str) -> Survey:
    s = Survey()
    try:
        with os.scandir(path) as top:
            for e in top:
                if e.is_dir():
                    s.classes.append(e.name)
                elif e.name.lower().endswith(IMAGE_SUFFIXES):
                    s.top_images += 1
        for c in s.classes:
            with os.scandir(Path(path) / c) as files:
                for e in files:
                    if e.is_file():
                        if e.name.lower().endswith(IMAGE_SUFFIXES):
                            s.images += 1
                        else:
                            s.other_files += 1
    except OSError as e:
        s.error = f"cannot be read: {e.strerror} ({e.filename})"
    s.classes.sort()
    return s


def folder_problems(d: DataConf, world: int) -> list[Problem]:
    if not d.path:
        return [Problem("data.path", "is required for data=folder", "set data.path=/path/to/images")]
    if not Path(d.path).is_dir():
        return [Problem("data.path", f"{d.path} is not a directory", f"point data.path at {LAYOUT}")]
    s = survey(d.path)
    if s.error:
        return [Problem("data.path", f"{d.path} {s.error}", "make it readable by this user")]
    if not s.classes:
        what = (
            f"is flat ({s.top_images} images directly in it)" if s.top_images else "has no class directories"
        )
        return [Problem("data.path", f"{d.path} {what}", f"arrange it as {LAYOUT}")]
    if not s.images:
        skipped = f" ({s.other_files} other files)" if s.other_files else ""
        return [
            Problem(
                "data.path",
                f"{d.path} has {len(s.classes)} class directories but no images{skipped}",
                f"put images ({', '.join(IMAGE_SUFFIXES)}) in {LAYOUT}",
            )
        ]
    p = []
    if s.images < world:
        p.append(
            Problem(
                "data.path",
                f"{d.path} has {s.images} images, fewer than the {world} ranks that each need one per step",
                f"add images, or run on at most {s.images} ranks",
            )
        )
    if len(s.classes) > d.num_classes:
        n = len(s.classes)
        p.append(
            Problem(
                "data.num_classes",
                f"{d.path} has {n} class directories, but the model has {d.num_classes} outputs: "
                f"labels {d.num_classes}..{n - 1} would be out of range",
                f"set data.num_classes={n}",
            )
        )
    return p
