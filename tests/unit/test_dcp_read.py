"""Sharded (DCP) checkpoints read without running code from them, and judged against this run's
state before the collective read: a planted `.metadata` or a planted value is refused and never
executed (torch's own reader would unpickle both), and a checkpoint of another shape or optimizer
is named by the key that does not fit. In-process, on DCP's real files."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from hpctrain.train import checkpoint
from hpctrain.train.dcp_read import misfit, read_metadata


class _Planted:
    def __init__(self, mark: Path) -> None:
        self.mark = mark

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"touch {self.mark}",))


def _saved(path: Path, width: int = 3) -> dict:
    state = {
        "model": {"w": torch.arange(4.0 * width).reshape(4, width)},
        "step": 7,
        "torch_rng": torch.get_rng_state(),
    }
    dcp.save(state, checkpoint_id=path, no_dist=True)
    return state


def test_metadata_and_values_read_back_and_a_fitting_state_fits(tmp_path: Path) -> None:
    state = _saved(tmp_path / "c")
    md = read_metadata(tmp_path / "c")
    assert list(md.state_dict_metadata["model.w"].size) == [4, 3]
    assert misfit(md, {"model": {"w": torch.zeros(4, 3)}, "step": 0}) is None
    full = checkpoint.read_full(tmp_path / "c")
    assert full["step"] == 7 and torch.equal(full["model"]["w"], state["model"]["w"])


def test_a_state_that_does_not_fit_is_named_by_its_key(tmp_path: Path) -> None:
    md = (_saved(tmp_path / "c"), read_metadata(tmp_path / "c"))[1]
    assert (
        misfit(md, {"model": {"w": torch.zeros(4, 5)}})
        == "'model.w' has shape [4, 3] there and [4, 5] in this run"
    )
    assert misfit(md, {"model": {"w": torch.zeros(4, 3), "b": torch.zeros(3)}}) == (
        "it holds no 'model.b' (written for another model or optimizer)"
    )


def test_a_planted_metadata_is_refused_and_never_run(tmp_path: Path) -> None:
    _saved(tmp_path / "c")
    mark = tmp_path / "pwned"
    (tmp_path / "c" / ".metadata").write_bytes(pickle.dumps(_Planted(mark)))
    with pytest.raises(pickle.UnpicklingError) as e:
        read_metadata(tmp_path / "c")
    assert checkpoint.planted(e.value) == "posix.system"
    with pytest.raises(checkpoint.UnsafeCheckpoint) as u:  # the whole-state reader refuses it too
        checkpoint.read_full(tmp_path / "c")
    assert u.value.found == "posix.system"
    assert not mark.exists()
    # torch's own reader would have run it: the reason for dcp_read
    from torch.distributed.checkpoint import FileSystemReader

    with pytest.raises(AttributeError):  # os.system's exit status is no Metadata, but it ran
        FileSystemReader(tmp_path / "c").read_metadata()
    assert mark.exists()


def test_a_planted_value_is_refused_and_never_run(tmp_path: Path) -> None:
    """A non-tensor value is stored as its own pickle (DCP's byte items); torch loads it with
    weights_only=False."""
    mark = tmp_path / "pwned"
    dcp.save(
        {"model": {"w": torch.zeros(2)}, "step": _Planted(mark)}, checkpoint_id=tmp_path / "c", no_dist=True
    )
    with pytest.raises(checkpoint.UnsafeCheckpoint) as e:
        checkpoint.read_full(tmp_path / "c")
    assert e.value.found == "posix.system" and not mark.exists()
    # torch's own planner would have run it
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    reader = FileSystemReader(tmp_path / "c")
    _load_state_dict({}, storage_reader=reader, planner=_EmptyStateDictLoadPlanner(), no_dist=True)
    assert mark.exists()


def test_a_planted_value_in_a_collective_read_is_named_by_what_it_holds(tmp_path: Path) -> None:
    """Round 5, class 11: the sharded resume path named it by torch's cut-off paragraph ("Weights
    only load failed. In PyTorch 2.6, we changed the default value of the `w") and a UserWarning."""
    import warnings

    from hpctrain.train import shard_checkpoint

    mark = tmp_path / "pwned"
    dcp.save(
        {"model": {"w": torch.zeros(2)}, "step": _Planted(mark)}, checkpoint_id=tmp_path / "c", no_dist=True
    )
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        why = shard_checkpoint._dcp_load(tmp_path / "c", {"model": {"w": torch.empty(2)}, "step": 0})
    assert why == "was refused and not run: a shard holds posix.system, not only tensors and numbers"
    assert not mark.exists()
    assert not [w for w in seen if "Weights only" in str(w.message) or "weights_only" in str(w.message)]
