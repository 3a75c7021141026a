"""Data for the recipes: torchvision-backed LightningDataModules, offline import, device-resident batches.

* :mod:`project.data.archives` -- archive integrity (md5, IDX sizes) and offline import;
* :mod:`project.data.modules` -- ``MNISTDataModule``, ``FashionMNISTDataModule``, ``KMNISTDataModule``,
  ``CIFAR10DataModule``, ``CIFAR100DataModule``;
* :mod:`project.data.folders` -- ``ImageFolderDataModule``: your own images in ``train/<class>/`` folders;
* :mod:`project.data.base` -- ``VisionDataModule``, the hooks they share (prepare, seeded split, loaders);
* :mod:`project.data.loaders` -- samplers and DataLoaders (resume-aware, worker processes), the batch check;
* :mod:`project.data.memory` -- :class:`~project.data.memory.EpochBatches`, the ``in_memory: true`` path.

The face: the class paths configs name, e.g. ``class_path: project.data.MNISTDataModule``.
"""

from project.data.base import VisionDataModule
from project.data.folders import ImageFolderDataModule
from project.data.modules import (
    CIFAR10DataModule,
    CIFAR100DataModule,
    FashionMNISTDataModule,
    KMNISTDataModule,
    MNISTDataModule,
)

__all__ = [
    "CIFAR10DataModule",
    "CIFAR100DataModule",
    "FashionMNISTDataModule",
    "ImageFolderDataModule",
    "KMNISTDataModule",
    "MNISTDataModule",
    "VisionDataModule",
]
