"""K-fold splits (project.data.folds) and the DataModules' ``folds``/``fold``: a partition of the training set,
stratified, seeded, the same on every rank; the test set untouched; ``folds`` unset is today's ``val_size`` split."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch.utils.data import DistributedSampler

from project.data.folds import fold_ids, fold_split
from project.data.modules import CIFAR10DataModule, MNISTDataModule
from project.errors import ConfigError


def make(cls, paths, **kw):
    return cls(data_dir=str(paths["data"]), source_dir=str(paths["source"]), **kw)


def splits(cls, paths, folds, seed=42, **kw):
    out = []
    for k in range(folds):
        dm = make(cls, paths, folds=folds, fold=k, seed=seed, **kw)
        dm.prepare_data()
        dm.setup("fit")
        out.append(dm)
    return out


@pytest.mark.parametrize("folds", [2, 5])
def test_folds_partition_the_training_set_and_leave_the_test_set_alone(folds, tiny_mnist):
    dms = splits(MNISTDataModule, tiny_mnist, folds)
    vals = [set(dm.split[1].tolist()) for dm in dms]
    assert sum(map(len, vals)) == 600 and set().union(*vals) == set(range(600))  # each image in exactly one fold
    for dm, val in zip(dms, vals):
        train = dm.split[0].tolist()
        assert set(train) == set(range(600)) - val and len(train) == 600 - len(val)
        assert len(val) in (600 // folds, -(-600 // folds))  # fold sizes differ by at most one
        assert dm.train_set.train and dm.val_set.train and not dm.test_set.train  # indices into the training set
        assert len(dm.test_dataloader().dataset) == 100  # the whole official test set, as without folds


def test_folds_are_stratified_by_class(tiny_mnist):
    dms = splits(MNISTDataModule, tiny_mnist, 5)
    labels = dms[0].labels()
    total = torch.bincount(labels, minlength=10)
    for dm in dms:
        per_class = torch.bincount(labels[dm.split[1]], minlength=10)
        assert torch.all((per_class == total // 5) | (per_class == -(-total // 5))), (per_class, total)


def test_cifar_folds_are_stratified_too(tiny_cifar):
    (dm,) = splits(CIFAR10DataModule, tiny_cifar, 2)[:1]
    labels = dm.labels()
    assert len(labels) == 500 and labels.dtype == torch.int64
    per_class = torch.bincount(labels[dm.split[1]], minlength=10)
    total = torch.bincount(labels, minlength=10)
    assert torch.all((per_class - total / 2).abs() <= 0.5)


def test_folds_are_seeded_and_setup_is_idempotent(tiny_mnist):
    a = splits(MNISTDataModule, tiny_mnist, 3)[1]
    first = [t.clone() for t in a.split]
    a.setup("test")
    assert all(torch.equal(x, y) for x, y in zip(first, a.split))
    b = splits(MNISTDataModule, tiny_mnist, 3)[1]
    assert all(torch.equal(x, y) for x, y in zip(first, b.split))
    c = splits(MNISTDataModule, tiny_mnist, 3, seed=1)[1]
    assert not torch.equal(first[1], c.split[1])


def test_without_folds_the_split_is_the_val_size_split_exactly(tiny_mnist):
    dm = make(MNISTDataModule, tiny_mnist, val_size=100, seed=7)
    dm.prepare_data()
    dm.setup("fit")
    perm = torch.randperm(600, generator=torch.Generator().manual_seed(7))  # the split before folds existed
    assert torch.equal(dm.split[0], perm[100:]) and torch.equal(dm.split[1], perm[:100])
    assert dm.hparams.folds is None and dm.hparams.fold == 0


def test_two_ranks_share_the_folds_and_shard_the_training_folds_disjointly(tiny_mnist):
    """DDP semantics simulated with two data modules standing in for ranks 0 and 1 (as test_datamodules does)."""
    make(MNISTDataModule, tiny_mnist).prepare_data()
    ranks = []
    for rank in range(2):
        dm = make(MNISTDataModule, tiny_mnist, folds=4, fold=3, batch_size=10)
        dm.trainer = SimpleNamespace(world_size=2, global_rank=rank, strategy=SimpleNamespace(root_device="cpu"))
        dm.setup("fit")
        ranks.append(dm)
    assert all(torch.equal(a, b) for a, b in zip(ranks[0].split, ranks[1].split))
    train = ranks[0].split[0]
    shards = [list(dm.train_dataloader().sampler) for dm in ranks]  # positions in the training fold
    assert set(shards[0]).isdisjoint(shards[1]) and set(shards[0]) | set(shards[1]) == set(range(len(train)))
    vals = [list(dm.val_dataloader().sampler) for dm in ranks]
    assert sorted(vals[0] + vals[1]) == list(range(150))  # the validation fold: every image once
    sampler = DistributedSampler(range(len(train)), num_replicas=2, rank=1, shuffle=True, seed=42)
    assert shards[1] == list(sampler)


def test_fold_ids_round_robin_within_each_class():
    labels = torch.tensor([0] * 7 + [1] * 3 + [2] * 5)
    ids = fold_ids(labels, 3, seed=0)
    assert ids.dtype == torch.int64 and set(ids.tolist()) == {0, 1, 2}
    for c, expected in ((0, [3, 2, 2]), (1, [1, 1, 1]), (2, [2, 2, 1])):
        counts = sorted(torch.bincount(ids[labels == c], minlength=3).tolist(), reverse=True)
        assert counts == expected, (c, counts)
    assert sorted(torch.bincount(ids, minlength=3).tolist()) == [5, 5, 5]
    train, val = fold_split(labels, 3, 2, seed=0)
    assert torch.equal(val, torch.nonzero(ids == 2).flatten()) and torch.equal(train, torch.nonzero(ids != 2).flatten())


@pytest.mark.parametrize(
    ("folds", "fold", "expected"),
    [
        (1, 0, "data.folds: 1 is not a cross-validation; use 2 or more"),
        (3, 3, "data.fold: 3 is not one of the 3 folds; use 0 to 2"),
        (4, 0, "data.folds: 4 folds but class 1 has only 3 training images"),
    ],
)
def test_bad_folds_are_config_errors(folds, fold, expected):
    labels = torch.tensor([0] * 7 + [1] * 3 + [2] * 5)
    with pytest.raises(ConfigError, match=expected):
        fold_split(labels, folds, fold, seed=0)


def test_a_data_set_without_targets_is_split_unstratified(tiny_mnist):
    dm = splits(MNISTDataModule, tiny_mnist, 2)[0]
    dm.train_set = list(range(600))  # a data set with no ``targets``
    assert torch.equal(dm.labels(), torch.zeros(600, dtype=torch.int64))
