"""Data for the recipes: torchvision-backed LightningDataModules, offline import, device-resident batches.

* :mod:`project.data.archives` -- archive integrity (md5, IDX sizes) and offline import;
* :mod:`project.data.modules` -- ``MNISTDataModule``, ``FashionMNISTDataModule``, ``CIFAR10DataModule``;
* :mod:`project.data.base` -- ``VisionDataModule``, the hooks they share (prepare, seeded split, loaders);
* :mod:`project.data.loaders` -- samplers and DataLoaders (resume-aware, worker processes), the batch check;
* :mod:`project.data.memory` -- :class:`EpochBatches`, the ``in_memory: true`` path.

Configs name the modules by their public path, e.g. ``class_path: project.data.MNISTDataModule``.
"""

from project.data.archives import RAW_MD5, check_idx_size
from project.data.memory import EpochBatches
from project.data.modules import (
    CIFAR10DataModule,
    FashionMNISTDataModule,
    MNISTDataModule,
    VisionDataModule,
)
from project.data.workers import worker_context

__all__ = [
    "RAW_MD5",
    "CIFAR10DataModule",
    "EpochBatches",
    "FashionMNISTDataModule",
    "MNISTDataModule",
    "VisionDataModule",
    "check_idx_size",
    "worker_context",
]
