"""How a data module's split becomes batches: samplers, DataLoaders, device-resident copies, the batch check.

* :func:`sampler` -- the training order depends only on ``(seed, epoch)`` and resumes mid-epoch
  (:class:`~project.data.resume.ResumableSampler`); evaluation is never padded under DDP;
* :func:`dataloader` -- torchvision's per-sample path: a ``DataLoader`` (a
  :class:`~project.data.resume.ResumableLoader` for training) with worker processes from
  :mod:`project.data.workers`;
* :func:`as_tensors` / :func:`device_splits` -- the ``in_memory: true`` path's uint8 copies of the splits, batched
  by :class:`~project.data.memory.EpochBatches`;
* :func:`check_sizes` -- refuse a split that gives no training batch.

Used by :class:`project.data.modules.VisionDataModule`'s ``*_dataloader`` hooks.
"""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSampler
from torch.utils.data import DataLoader, Dataset, DistributedSampler
from torchvision import datasets

from project.data.resume import ResumableLoader, ResumableSampler
from project.data.workers import worker_context, worker_init
from project.errors import ConfigError


def sampler(dataset: Any, train: bool, world: int, rank: int, seed: int) -> DistributedSampler:
    """The sampler of one stage's loader on process ``rank`` of ``world``.

    Training: a :class:`ResumableSampler` (a ``DistributedSampler``) even for one process: the order depends only on
    (``seed``, epoch), so a resumed run sees the same batches as an uninterrupted one, and DDP ranks shard one
    permutation; a mid-epoch checkpoint resumes on the very next batch (see :mod:`project.data.resume`).
    Evaluation: Lightning's ``UnrepeatedDistributedSampler``, in order and without padding under DDP, so evaluation
    metrics count every sample exactly once.
    """
    if train:
        return ResumableSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=seed)
    return UnrepeatedDistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=False)


def dataloader(
    dataset: Dataset,
    sampler: Any,
    batch_size: int,
    num_workers: int,
    pin_memory: bool,
    persistent_workers: bool,
    drop_last: bool = False,
    train: bool = False,
) -> DataLoader:
    """A ``DataLoader`` over ``dataset`` in ``sampler``'s order; a :class:`ResumableLoader` when ``train``.

    With ``num_workers > 0`` the workers start from :func:`~project.data.workers.worker_context`'s fork server and
    die with it; ``persistent_workers`` applies only then.
    """
    return (ResumableLoader if train else DataLoader)(
        dataset,
        multiprocessing_context=worker_context() if num_workers > 0 else None,
        worker_init_fn=worker_init if num_workers > 0 else None,
        batch_size=batch_size,
        sampler=sampler,
        drop_last=drop_last,
        num_workers=num_workers,
        pin_memory=pin_memory,
        persistent_workers=persistent_workers and num_workers > 0,
    )


def as_tensors(ds: datasets.VisionDataset) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole data set as uint8 images (N, C, H, W) and int64 targets (N,), both on CPU."""
    data = torch.as_tensor(ds.data)
    images = data.unsqueeze(1) if data.ndim == 3 else data.permute(0, 3, 1, 2)
    return images.contiguous(), torch.as_tensor(ds.targets, dtype=torch.int64)


def device_splits(
    train_set: datasets.VisionDataset,
    test_set: datasets.VisionDataset,
    split: tuple[torch.Tensor, torch.Tensor],
    device: torch.device,
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """``{"train", "val", "test"}`` -> (uint8 images (N, C, H, W), int64 targets (N,)) on ``device``.

    ``split`` is the (train, val) index pair into ``train_set`` (the official training set); ``test_set`` is
    taken whole.
    """
    images, targets = as_tensors(train_set)
    train_idx, val_idx = split
    tensors = {
        "train": (images[train_idx].to(device), targets[train_idx].to(device)),
        "val": (images[val_idx].to(device), targets[val_idx].to(device)),
    }
    images, targets = as_tensors(test_set)
    tensors["test"] = (images.to(device), targets.to(device))
    return tensors


def pixel_statistics(data: Any, indices: torch.Tensor) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and standard deviation (population, ``correction=0``) of pixel values in [0, 1] over the
    images ``indices`` of ``data`` (uint8, (N, H, W) or (N, H, W, C); a tensor or an array), summed in float64 a
    block at a time (a 60,000-image set never becomes one float copy). A std of 0 (a constant image) is 1.0."""
    images = torch.as_tensor(data)
    images = images.unsqueeze(-1) if images.ndim == 3 else images
    total = torch.zeros(images.shape[-1], dtype=torch.float64)
    squares = torch.zeros_like(total)
    count = 0
    for block in torch.split(torch.as_tensor(indices, dtype=torch.int64), 8192):
        x = images[block].to(torch.float64).div_(255).reshape(-1, images.shape[-1])
        total += x.sum(0)
        squares += x.square().sum(0)
        count += x.shape[0]
    mean = total / max(count, 1)
    std = (squares / max(count, 1) - mean.square()).clamp_min(0).sqrt()
    return tuple(float(m) for m in mean), tuple(float(s) or 1.0 for s in std)


def check_sizes(n_train: int, world: int, batch_size: int, val_size: int) -> None:
    """Refuse a split that gives no training batch.

    Training must have at least one batch per process: ``n_train // world`` images, fewer than ``batch_size``
    giving none when the last partial batch is dropped (``torch.backends.cudnn.benchmark``, set by
    ``trainer.benchmark: true``).

    Raises:
        ConfigError: naming the sizes and the keys to change (``data.val_size``, ``data.batch_size``).
    """
    per_rank = n_train // world
    drop_last = torch.backends.cudnn.benchmark
    if per_rank == 0 or (drop_last and per_rank < batch_size):
        why = " and drops the last partial batch (trainer.benchmark: true)" if drop_last and per_rank else ""
        raise ConfigError(
            f"data: {n_train} training images ({val_size} of the official training set held out by "
            f"data.val_size) over {world} process(es) with data.batch_size {batch_size}{why} give no training batch; "
            "lower data.val_size or data.batch_size"
        )
