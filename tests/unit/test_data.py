"""Sharding: N ranks with batch G/N see, together, exactly what one rank with batch G sees."""

from __future__ import annotations

import pytest
import torch

from hpctrain.config.options import Dataset
from hpctrain.train.data import GlobalBatchSampler


def _steps(
    n: int, g: int, ranks: int, steps: int, seed: int = 3, shuffle: bool = True
) -> list[list[list[int]]]:
    b = g // ranks
    per_rank = [list(GlobalBatchSampler(n, g, r, b, steps, seed, shuffle)) for r in range(ranks)]
    return [[per_rank[r][s] for r in range(ranks)] for s in range(steps)]


@pytest.mark.parametrize("ranks", [2, 4])
def test_union_of_rank_batches_is_the_single_rank_batch(ranks: int) -> None:
    single = _steps(100, 16, 1, 20)
    multi = _steps(100, 16, ranks, 20)
    for s in range(20):
        assert sum(multi[s], []) == single[s][0]


def test_ranks_are_disjoint_and_cover_an_epoch_without_repeats() -> None:
    steps = _steps(64, 16, 2, 4)  # exactly one epoch
    seen = [i for step in steps for rank in step for i in rank]
    assert sorted(seen) == list(range(64))


def test_epochs_reshuffle_and_drop_the_partial_batch() -> None:
    steps = _steps(40, 16, 1, 4)  # 2 full batches per epoch; 8 samples dropped each epoch
    e0 = steps[0][0] + steps[1][0]
    e1 = steps[2][0] + steps[3][0]
    assert e0 != e1 and len(set(e0)) == 32 and len(set(e1)) == 32


def test_no_shuffle_is_in_order() -> None:
    assert _steps(8, 4, 2, 2, shuffle=False) == [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]


def test_resume_from_a_step_continues_the_same_order() -> None:
    full = list(GlobalBatchSampler(50, 10, 0, 5, 12, 1, True))
    tail = list(GlobalBatchSampler(50, 10, 0, 5, 12, 1, True, start_step=7))
    assert tail == full[7:]


def test_global_batch_larger_than_dataset_is_refused() -> None:
    with pytest.raises(ValueError):
        GlobalBatchSampler(8, 16, 0, 8, 1, 0, True)


def test_digits_read_without_scikit_learn_equal_load_digits() -> None:
    """data=digits reads the package's file itself (no sklearn import in every rank): the same
    images and labels, bit for bit, as sklearn.datasets.load_digits, standardised (its training
    and held-out parts together, in the split's order)."""
    from sklearn.datasets import load_digits

    from hpctrain.train.data import digits

    d, train, test = load_digits(), digits("train"), digits("test")
    order = torch.randperm(1797, generator=torch.Generator().manual_seed(0))
    x = torch.tensor(d.images, dtype=torch.float32).unsqueeze(1)
    assert torch.equal(torch.cat([train.tensors[0], test.tensors[0]]), ((x - x.mean()) / x.std())[order])
    assert torch.equal(torch.cat([train.tensors[1], test.tensors[1]]), torch.tensor(d.target)[order])


def test_the_digits_hold_out_360_samples_the_training_never_sees_whatever_the_seed() -> None:
    from hpctrain.config.schema import DataConf
    from hpctrain.train.data import build_dataset, digits, held_out, holds_out

    train, test = digits("train"), digits("test")
    assert (len(train), len(test)) == (1437, 360)
    rows = {tuple(x.flatten().tolist()) for x in train.tensors[0]}
    assert not any(tuple(x.flatten().tolist()) in rows for x in test.tensors[0])  # no sample in both
    conf = DataConf(name=Dataset.digits, channels=1, image_size=8)
    for seed in (0, 7):  # the split is the data's, not the run's
        assert torch.equal(build_dataset(conf, seed).tensors[0], train.tensors[0])
    assert holds_out(conf) and torch.equal(held_out(conf).tensors[1], test.tensors[1])
    assert not holds_out(DataConf())  # synthetic data holds nothing out
