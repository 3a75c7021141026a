"""LightningDataModules for MNIST, Fashion-MNIST and CIFAR-10 on torchvision's dataset classes.

Each names its torchvision data set, its image shape and normalization, the files it expects under
``data_dir`` with their md5 sums, and how its original archives are imported (:mod:`project.data.archives`).
The hooks they share -- where the data comes from (``prepare_data``), the seeded train/val split (``setup``) and
the loaders -- are :class:`~project.data.base.VisionDataModule`'s, re-exported here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torchvision import datasets
from torchvision import transforms as T

from project.adapters import to_builtin
from project.data.archives import FIX, RAW_MD5, check_idx_size, check_md5, import_cifar_archive, import_idx_archives
from project.data.base import VisionDataModule
from project.errors import DataError

__all__ = ["CIFAR10DataModule", "FashionMNISTDataModule", "MNISTDataModule", "VisionDataModule"]


class _MNISTFamily(VisionDataModule):
    input_shape = (1, 28, 28)

    @property
    def raw_folder(self) -> Path:
        return self.data_dir / self.dataset_cls.__name__ / "raw"

    def raw_md5(self) -> dict[str, str]:
        return RAW_MD5[self.dataset_cls.__name__]

    def expected_files(self) -> list[Path]:
        return [self.raw_folder / name for name in self.raw_md5()]

    def archive_names(self) -> list[str]:
        return [name for name, _ in self.dataset_cls.resources]

    def local_archive_dir(self) -> Path:
        return self.raw_folder

    def verify(self, md5: bool = True) -> None:
        for path, expected in zip(self.expected_files(), self.raw_md5().values()):
            if not path.exists():
                raise DataError(f"{path} is missing; {FIX}")
            check_idx_size(path)
            if md5:
                check_md5(path, expected)

    def import_archives(self, source_dir: Path) -> None:
        import_idx_archives(self.dataset_cls, source_dir, self.raw_folder)


class MNISTDataModule(_MNISTFamily):
    """MNIST digits (LeCun et al.): 60,000 train / 10,000 test images, 1x28x28 uint8, 10 classes.

    Normalization: mean 0.1307, std 0.3081 (the PyTorch MNIST example's values). See
    :class:`VisionDataModule` for the arguments and errors.
    """

    dataset_cls = datasets.MNIST
    mean, std = (0.1307,), (0.3081,)


class FashionMNISTDataModule(_MNISTFamily):
    """Fashion-MNIST (Xiao et al. 2017): 60,000 train / 10,000 test images, 1x28x28 uint8, 10 classes.

    Normalization: mean 0.2860, std 0.3530 (computed over the training set). See
    :class:`VisionDataModule` for the arguments and errors.
    """

    dataset_cls = datasets.FashionMNIST
    mean, std = (0.2860,), (0.3530,)


class CIFAR10DataModule(VisionDataModule):
    """CIFAR-10 (Krizhevsky 2009): 50,000 train / 10,000 test images, 3x32x32 uint8, 10 classes.

    Normalization: the usual per-channel training-set mean (0.4914, 0.4822, 0.4465) and std
    (0.2470, 0.2435, 0.2616). ``augment: true`` adds the standard training augmentation: random crop
    with 4-pixel zero padding and horizontal flip; validation and test batches are never augmented.
    See :class:`VisionDataModule` for the other arguments and errors.
    """

    dataset_cls = datasets.CIFAR10
    mean, std = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
    input_shape = (3, 32, 32)

    def __init__(self, *args: Any, augment: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.save_hyperparameters(logger=False)
        to_builtin(self.hparams)

    def augments(self) -> bool:
        return bool(self.hparams.augment)

    def train_transform(self) -> Any:
        if not self.hparams.augment:
            return self.eval_transform()
        return T.Compose(
            [T.RandomCrop(32, padding=4), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(self.mean, self.std)]
        )

    @property
    def base_folder(self) -> Path:
        return self.data_dir / self.dataset_cls.base_folder

    def _file_md5s(self) -> list[tuple[str, str]]:
        cls = self.dataset_cls
        return [tuple(x) for x in cls.train_list + cls.test_list] + [(cls.meta["filename"], cls.meta["md5"])]

    def expected_files(self) -> list[Path]:
        return [self.base_folder / name for name, _ in self._file_md5s()]

    def archive_names(self) -> list[str]:
        return [self.dataset_cls.filename]

    def local_archive_dir(self) -> Path:
        return self.data_dir

    def verify(self, md5: bool = True) -> None:
        # torchvision's CIFAR10 md5-checks every batch file on each load, so setup (md5=False) checks presence
        # only; prepare_data checks md5 first to name the bad file.
        for name, expected in self._file_md5s():
            path = self.base_folder / name
            if not path.is_file():
                raise DataError(f"{path} is missing; {FIX}")
            if md5:
                check_md5(path, expected)

    def import_archives(self, source_dir: Path) -> None:
        import_cifar_archive(self.dataset_cls, source_dir, self.data_dir)
