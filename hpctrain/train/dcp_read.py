"""Reading sharded (DCP) checkpoints without running code from them, and judging whether one fits.

torch.distributed.checkpoint unpickles a checkpoint's `.metadata` with plain `pickle.load` and its
non-tensor values with `torch.load(weights_only=False)`: a `.metadata` planted in a run directory
that `train.resume_from` names would run its author's code as the user. hpctrain reads both with
an allow-list instead: the metadata may name only DCP's own record classes and torch's sizes,
dtypes and layouts; the values are read with torch's weights_only loader (numbers and tensors are
all hpctrain writes).
"""

from __future__ import annotations

import io
import pickle
import re
import warnings
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, _EmptyStateDictLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata
from torch.distributed.checkpoint.planner import ReadItem

METADATA = ".metadata"
_RECORDS = "torch.distributed.checkpoint.metadata"  # DCP's dataclasses: sizes, offsets, indices
_ALLOWED = {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch.serialization", "_get_layout"),  # a layout by its name ("torch.strided")
    ("torch", "Size"),
    ("pathlib", "PosixPath"),
    ("collections", "OrderedDict"),
}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module == _RECORDS or (module, name) in _ALLOWED:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"GLOBAL {module}.{name}")


def read_metadata(path: Path) -> Metadata:
    """A DCP checkpoint's metadata. Naming anything beyond DCP's records is refused with
    pickle.UnpicklingError('GLOBAL module.name'), as torch's weights_only loader says it."""
    with (path / METADATA).open("rb") as f:
        md = _MetadataUnpickler(f).load()
    if not isinstance(md, Metadata):
        raise ValueError(f"{path / METADATA} is not a checkpoint's metadata")
    return md


class SafeReader(FileSystemReader):
    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        return read_metadata(Path(self.path))


def _load_bytes(planner: DefaultLoadPlanner, read_item: ReadItem, value: io.BytesIO) -> None:
    """DefaultLoadPlanner.load_bytes with torch's weights_only loader instead of a plain unpickle.
    A refusal is said as 'GLOBAL module.name', what the value holds (torch's own message is a
    paragraph about its 2.6 default, and a UserWarning beside it)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            loaded = torch.load(value, weights_only=True)
    except pickle.UnpicklingError as e:
        named = re.search(r"GLOBAL (\S+?)[,:\s]", f"{e} ")
        raise pickle.UnpicklingError(
            f"GLOBAL {named.group(1)}" if named else str(e).splitlines()[0]
        ) from None
    if planner.flatten_state_dict:
        set_element(planner.original_state_dict, planner.mappings[read_item.dest_index.fqn], loaded)
    else:
        planner.state_dict[read_item.dest_index.fqn] = loaded


class SafeLoadPlanner(DefaultLoadPlanner):
    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        _load_bytes(self, read_item, value)


class SafeWholePlanner(_EmptyStateDictLoadPlanner):
    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        _load_bytes(self, read_item, value)


def misfit(md: Metadata, state: dict[str, Any]) -> str | None:
    """What keeps `state` (model and optimizer as this run builds them) from loading from a
    checkpoint with this metadata: the first key it lacks or holds in another shape; None if it
    fits. Pure, and the same on every rank (shapes are global, DTensor or not)."""
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict

    flat, _ = flatten_state_dict(state)
    have = md.state_dict_metadata
    for key, value in flat.items():
        if key not in have:
            return f"it holds no {key!r} (written for another model or optimizer)"
        saved = have[key]
        if isinstance(value, torch.Tensor) and isinstance(saved, TensorStorageMetadata):
            if tuple(value.size()) != tuple(saved.size):
                return f"{key!r} has shape {list(saved.size)} there and {list(value.size())} in this run"
    return None
