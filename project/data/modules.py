"""LightningDataModules for MNIST, Fashion-MNIST, KMNIST, CIFAR-10 and CIFAR-100 on torchvision's dataset classes.

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
from project.data.archives import (
    FIX,
    RAW_MD5,
    check_against_archive,
    check_idx_size,
    check_md5,
    import_cifar_archive,
    import_idx_archives,
)
from project.data.base import VisionDataModule
from project.errors import DataError

__all__ = [
    "CIFAR100DataModule",
    "CIFAR10DataModule",
    "FashionMNISTDataModule",
    "KMNISTDataModule",
    "MNISTDataModule",
    "VisionDataModule",
]


class _RawFilesOnly:
    """torchvision's MNIST family reads ``<Dataset>/processed/training.pt`` and ``test.pt`` (the cache torchvision
    < 0.8 wrote) in preference to the raw IDX files whenever both are present, with no check of their content: a
    pair planted next to md5-clean raw files is what would train and test. These classes read the raw files only,
    which :meth:`_MNISTFamily.verify` checks (size on every setup, md5 in ``prepare_data``); a ``processed/``
    folder is ignored. The class names are torchvision's, which name the folders (``MNIST/raw``)."""

    def _check_legacy_exist(self) -> bool:
        return False


class MNIST(_RawFilesOnly, datasets.MNIST):
    """torchvision's :class:`~torchvision.datasets.MNIST` reading the raw IDX files only (:class:`_RawFilesOnly`)."""


class FashionMNIST(_RawFilesOnly, datasets.FashionMNIST):
    """torchvision's :class:`~torchvision.datasets.FashionMNIST` reading the raw IDX files only
    (:class:`_RawFilesOnly`)."""


class KMNIST(_RawFilesOnly, datasets.KMNIST):
    """torchvision's :class:`~torchvision.datasets.KMNIST` reading the raw IDX files only (:class:`_RawFilesOnly`)."""


class _MNISTFamily(VisionDataModule):
    input_shape = (1, 28, 28)

    @property
    def raw_folder(self) -> Path:
        return self.data_dir / self.dataset_cls.__name__ / "raw"

    def expected_files(self) -> list[Path]:
        return [self.raw_folder / name.removesuffix(".gz") for name, _ in self.dataset_cls.resources]

    def archive_names(self) -> list[str]:
        return [name for name, _ in self.dataset_cls.resources]

    def local_archive_dir(self) -> Path:
        return self.raw_folder

    def verify(self, md5: bool = True) -> None:
        """Sizes from the IDX headers always; with ``md5``, each file's published md5 (:data:`RAW_MD5`), or, for a
        data set that publishes only its archives' md5 (KMNIST), the file against its kept archive
        (:func:`check_against_archive`).

        Raises:
            DataError: naming the first missing, truncated or changed file.
        """
        published = RAW_MD5.get(self.dataset_cls.__name__)
        for path, (archive, archive_md5) in zip(self.expected_files(), self.dataset_cls.resources):
            if not path.exists():
                raise DataError(f"{path} is missing; {FIX}")
            check_idx_size(path)
            if md5 and published is not None:
                check_md5(path, published[path.name])
            elif md5:
                check_against_archive(path, self.raw_folder / archive, archive_md5)

    def import_archives(self, source_dir: Path) -> None:
        import_idx_archives(self.dataset_cls, source_dir, self.raw_folder)


class MNISTDataModule(_MNISTFamily):
    """MNIST digits (LeCun et al.): 60,000 train / 10,000 test images, 1x28x28 uint8, 10 classes.

    Normalization: mean 0.1307, std 0.3081 (the PyTorch MNIST example's values). See
    :class:`VisionDataModule` for the arguments and errors.
    """

    dataset_cls = MNIST
    mean, std = (0.1307,), (0.3081,)


class FashionMNISTDataModule(_MNISTFamily):
    """Fashion-MNIST (Xiao et al. 2017): 60,000 train / 10,000 test images, 1x28x28 uint8, 10 classes.

    Normalization: mean 0.2860, std 0.3530 (computed over the training set). See
    :class:`VisionDataModule` for the arguments and errors.
    """

    dataset_cls = FashionMNIST
    mean, std = (0.2860,), (0.3530,)


class KMNISTDataModule(_MNISTFamily):
    """Kuzushiji-MNIST (Clanuwat et al. 2018, "Deep Learning for Classical Japanese Literature"): 60,000 train /
    10,000 test images, 1x28x28 uint8, 10 classes of cursive hiragana (``o``, ``ki``, ``su``, ``tsu``, ``na``,
    ``ha``, ``ma``, ``ya``, ``re``, ``wo``: torchvision's ``KMNIST.classes``).

    Normalization: the training split's own mean and std, computed at setup and carried in the checkpoint
    (:attr:`~project.data.base.VisionDataModule.stats_from_data`): no statistics are published with the set.
    Integrity: torchvision publishes the md5 of the four ``.gz`` archives only, so the archives are kept in
    ``KMNIST/raw/`` beside their content (as torchvision's own download leaves them) and ``prepare_data`` checks
    each extracted file against its archive; the offline import (``source_dir``) takes only the original
    archives. See :class:`VisionDataModule` for the arguments and errors.
    """

    dataset_cls = KMNIST
    mean, std = (0.5,), (0.5,)  # until setup (or a checkpoint) gives the training split's own
    stats_from_data = True


# The label names of the published archives' ``batches.meta`` / ``meta`` files, by class index: known without the
# files, so that ``predict`` on a run needs no data set (torchvision reads them only when it loads the data).
CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
CIFAR100_CLASSES = tuple(
    """apple aquarium_fish baby bear beaver bed bee beetle bicycle bottle bowl boy bridge bus butterfly camel can
    castle caterpillar cattle chair chimpanzee clock cloud cockroach couch crab crocodile cup dinosaur dolphin
    elephant flatfish forest fox girl hamster house kangaroo keyboard lamp lawn_mower leopard lion lizard
    lobster man maple_tree motorcycle mountain mouse mushroom oak_tree orange orchid otter palm_tree pear
    pickup_truck pine_tree plain plate poppy porcupine possum rabbit raccoon ray road rocket rose sea seal
    shark shrew skunk skyscraper snail snake spider squirrel streetcar sunflower sweet_pepper table tank
    telephone television tiger tractor train trout tulip turtle wardrobe whale willow_tree wolf woman worm""".split()
)


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
    label_names: tuple[str, ...] = CIFAR10_CLASSES

    @property
    def classes(self) -> list[str]:
        """The class names by index (torchvision's CIFAR classes hold them only once the data are loaded)."""
        return list(self.label_names)

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


class CIFAR100DataModule(CIFAR10DataModule):
    """CIFAR-100 (Krizhevsky 2009): 50,000 train / 10,000 test images, 3x32x32 uint8, 100 classes (the fine labels;
    SimpleCNN then has 100 outputs).

    Normalization: the per-channel training-set mean (0.5071, 0.4865, 0.4409) and std (0.2673, 0.2564, 0.2762).
    Offline import: ``cifar-100-python.tar.gz`` in ``source_dir``, md5-checked, extracted member by member as
    CIFAR-10's. ``augment`` and the other arguments as :class:`CIFAR10DataModule`.
    """

    dataset_cls = datasets.CIFAR100
    mean, std = (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)
    num_classes = 100
    label_names = CIFAR100_CLASSES
