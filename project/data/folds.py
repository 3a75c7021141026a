"""K-fold splits of a training set: which images validate and which train for fold ``k`` of ``K``.

The split is stratified by class (each class spread over the folds as evenly as it divides) and drawn from a
seeded ``torch.Generator``, so every rank of a DDP run and every resume of a run computes the same folds from
``(labels, folds, seed)`` alone: nothing is communicated or stored. The folds of one seed partition the training
set (every image validates in exactly one fold); another seed gives another partition (repeated K-fold).

The same scheme as scikit-learn's ``StratifiedKFold(shuffle=True)`` in effect (per-class counts per fold differ
by at most one, fold sizes by at most one), not its exact indices.
"""

from __future__ import annotations

import torch

from project.errors import ConfigError


def check_folds(folds: int, fold: int = 0) -> None:
    """Refuse ``folds`` < 2 and a ``fold`` outside ``[0, folds)``.

    Raises:
        ConfigError: naming the key and the values it takes.
    """
    if folds < 2:
        raise ConfigError(f"data.folds: {folds} is not a cross-validation; use 2 or more folds (or leave it unset)")
    if not 0 <= fold < folds:
        raise ConfigError(f"data.fold: {fold} is not one of the {folds} folds; use 0 to {folds - 1}")


def fold_ids(labels: torch.Tensor, folds: int, seed: int) -> torch.Tensor:
    """The validation fold of each image: int64 (N,) with values in ``[0, folds)``.

    Images are shuffled with ``torch.randperm(N)`` from a ``torch.Generator`` seeded with ``seed``, stably sorted
    by class (random order within each class), and dealt out round-robin: class by class, the next image goes to
    the next fold. So each class has ``floor`` or ``ceil`` of ``count / folds`` images in every fold, and fold sizes
    differ by at most one.

    Args:
        labels: int64 (N,) class of each training image (all zeros: no stratification).
        folds: the number of folds K (>= 2).
        seed: the generator's seed.

    Raises:
        ConfigError: ``folds`` < 2, or more folds than images of some class (a fold would lack that class).
    """
    labels = torch.as_tensor(labels, dtype=torch.int64)
    check_folds(folds)
    classes, counts = torch.unique(labels, return_counts=True)
    if len(counts) and int(counts.min()) < folds:
        rarest = int(counts.argmin())
        raise ConfigError(
            f"data.folds: {folds} folds but class {int(classes[rarest])} has only {int(counts[rarest])} training "
            f"images, so some validation folds would lack it; use data.folds <= {int(counts.min())}"
        )
    perm = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    order = perm[torch.argsort(labels[perm], stable=True)]
    ids = torch.empty(len(labels), dtype=torch.int64)
    ids[order] = torch.arange(len(labels)) % folds
    return ids


def holdout_split(n: int, val_size: int, seed: int, images: str, fix: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(train, val)`` indices into a training set of ``n`` images: ``val_size`` drawn at random by a
    ``torch.Generator`` seeded with ``seed`` (the same on every rank and every resume), the rest to train.

    Raises:
        ConfigError: ``val_size`` not smaller than ``n`` (``images`` names the set, ``fix`` what to do).
    """
    if val_size >= n:
        raise ConfigError(f"data.val_size: {val_size} must be smaller than the {n} {images}; {fix}")
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    return perm[val_size:], perm[:val_size]


def fold_split(labels: torch.Tensor, folds: int, fold: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(train, val)`` indices into the training set for fold ``fold`` of ``folds`` (:func:`fold_ids`): int64,
    ascending; ``val`` is fold ``fold``, ``train`` the other ``folds - 1`` folds.

    Raises:
        ConfigError: ``fold`` outside ``[0, folds)``, or what :func:`fold_ids` raises.
    """
    check_folds(folds, fold)
    ids = fold_ids(labels, folds, seed)
    return torch.nonzero(ids != fold).flatten(), torch.nonzero(ids == fold).flatten()
