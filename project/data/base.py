"""VisionDataModule: the LightningDataModule hooks that MNIST, Fashion-MNIST and CIFAR-10 share.

Where the data comes from (``prepare_data``, run once per node):

* files already extracted under ``data_dir`` (torchvision's layout: ``<data_dir>/MNIST/raw``,
  ``<data_dir>/FashionMNIST/raw``, ``<data_dir>/cifar-10-batches-py``) are verified and used;
* else ``source_dir``: a folder holding the original archives as published (``train-images-idx3-ubyte.gz``
  and friends; ``cifar-10-python.tar.gz``) is imported without network access, each archive checked
  against the md5 sums torchvision publishes;
* else ``download: true``: torchvision's own download (with its md5 checks).

Every extracted file is then checked: MNIST-family IDX files by size (from their header) and md5,
CIFAR-10 batches by the md5 sums torchvision lists. torchvision itself checks MNIST files only at
download time, so a truncated file would otherwise load silently.

``setup`` splits the official training set into train/val with a seeded ``torch.Generator`` (the
same split on every rank and every call): ``val_size`` images validate, or, with ``folds``, fold ``fold`` of a
stratified K-fold split (:mod:`project.data.folds`); the official test set stays the test set.

How a split becomes batches (samplers, DataLoaders, device-resident copies) is :mod:`project.data.loaders`; the
three data sets themselves (files, md5 sums, normalization, augmentation) are :mod:`project.data.modules`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, cast

import lightning as L
import torch
from jsonargparse.typing import NonNegativeInt, PositiveInt
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Subset
from torchvision import datasets
from torchvision import transforms as T

from project.adapters import to_builtin
from project.data import loaders
from project.data.archives import FIX, created_dirs, download_with_torchvision, preparation_lock
from project.data.folds import fold_split, holdout_split
from project.data.images import ImageFiles, image_files
from project.data.memory import EpochBatches
from project.data.resume import ResumableLoader, batches_done
from project.errors import ConfigError, DataError

if TYPE_CHECKING:
    from lightning.fabric.utilities.data import AttributeDict

log = logging.getLogger(__name__)

# Where extracted data lives unless data.data_dir says otherwise; also the folder the run-folder commands read (a
# copied run's own data_dir is not followed: docs/security.md).
DEFAULT_DATA_DIR = "data"
# Training images of an archive data set split off for validation when data.val_size is unset (None). Unset, not
# 5000, is the parser's default, so that a config switching data.class_path carries no number the user never wrote
# (the image-folder data module reads unset as "a tenth of train/"), and a 5000 the user writes is taken as written.
DEFAULT_VAL_SIZE = 5000


class VisionDataModule(L.LightningDataModule):
    """Common logic of the three data modules; use a subclass.

    Args:
        data_dir: where extracted data lives (torchvision's layout); created if missing.
        source_dir: folder with the original published archives to import offline (md5-checked); optional.
        download: let torchvision download missing files (needs network access).
        batch_size: samples per training batch (per process under DDP).
        eval_batch_size: samples per validation/test batch; default ``batch_size``. It changes no result. On
            a GPU a larger batch is usually faster; on a CPU the one whose activations fit the cache is
            (docs/decisions.md).
        num_workers: DataLoader worker processes (torchvision path only).
        pin_memory: DataLoader ``pin_memory`` (useful when training on a GPU).
        persistent_workers: keep workers alive between epochs (only with ``num_workers > 0``).
        val_size: images taken from the official training set for validation (seeded split); unset (default):
            5000 (:data:`DEFAULT_VAL_SIZE`). Refused with ``folds`` (a fold validates there).
        folds: K-fold cross-validation: split the official training set into this many folds (>= 2), stratified
            by class (:mod:`project.data.folds`); fold ``fold`` validates, the other ``folds - 1`` train.
            Unset (default): the ``val_size`` split, exactly as without this option.
        fold: which fold validates, 0 to ``folds - 1`` (with ``folds`` only).
        seed: seed of the train/val split (the folds too) and of the per-epoch shuffling order.
        in_memory: decode the split once into a uint8 tensor (N, C, H, W) on the training device and batch it
            with tensor ops (:class:`EpochBatches`) instead of a per-sample torchvision DataLoader.

    Training loaders drop the last partial batch when ``torch.backends.cudnn.benchmark`` is on (set by
    ``trainer.benchmark``), so every step has the same input shape and cudnn autotunes once.

    Raises:
        ConfigError: a bad value (``batch_size < 1``, ``val_size`` not smaller than the training set, ``folds`` < 2,
            ``fold`` not below ``folds``, more folds than images of some class, ...).
        DataError: data missing, truncated or failing md5, or a failed download.
    """

    dataset_cls: ClassVar[type[datasets.VisionDataset]]
    # per data set (class attributes), or per instance where the data decide them (project.data.folders)
    mean: tuple[float, ...]
    std: tuple[float, ...]
    input_shape: tuple[int, int, int]
    num_classes: int = 10
    resize: str = "stretch"  # how predict brings a picture of another size to input_shape (images.fit_to)
    # True: ``mean``/``std`` are the training split's own, computed at setup (loaders.pixel_statistics) and carried
    # in the checkpoint (a data set with no published statistics); the class's values stand until then
    stats_from_data: ClassVar[bool] = False
    _stats_loaded = False  # the statistics came from a checkpoint: setup keeps them

    if TYPE_CHECKING:  # Lightning types it AttributeDict | MutableMapping; save_hyperparameters makes it the former

        @property
        def hparams(self) -> AttributeDict:
            """The constructor's arguments (``self.hparams.batch_size``, ...)."""

    def __init__(
        self,
        data_dir: str = DEFAULT_DATA_DIR,
        source_dir: str | None = None,
        download: bool = True,
        batch_size: PositiveInt = 64,
        eval_batch_size: PositiveInt | None = None,
        num_workers: NonNegativeInt = 0,
        pin_memory: bool = False,
        persistent_workers: bool = False,
        val_size: NonNegativeInt | None = None,
        folds: PositiveInt | None = None,
        fold: NonNegativeInt = 0,
        seed: int = 42,
        in_memory: bool = False,
    ) -> None:
        super().__init__()
        self.save_hyperparameters(logger=False)
        to_builtin(self.hparams)
        if val_size is None:  # the archive sets' default; a subclass whose data decide it saves its own hparams
            self.hparams.val_size = DEFAULT_VAL_SIZE
        # "~" is the home folder, as torchvision's own datasets read their root (os.path.expanduser)
        self.data_dir = Path(data_dir).expanduser()
        self.source_dir = Path(source_dir).expanduser() if source_dir else None
        self.train_set: datasets.VisionDataset | None = None
        self.split: tuple[torch.Tensor, torch.Tensor] | None = None
        self._tensors: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        self.predict_set: ImageFiles | None = None
        self._resume_batches = 0

    # -- files ---------------------------------------------------------------------------------
    def expected_files(self) -> list[Path]:
        """The extracted files torchvision reads, under ``data_dir``."""
        raise NotImplementedError

    def archive_names(self) -> list[str]:
        """File names of the original archives that ``source_dir`` must hold."""
        raise NotImplementedError

    def verify(self, md5: bool = True) -> None:
        """Check every extracted file exists and is intact (size always, md5 when ``md5``).

        Raises:
            DataError: naming the first missing or bad file and how to fix it.
        """
        raise NotImplementedError

    def import_archives(self, source_dir: Path) -> None:
        """Extract the original archives in ``source_dir`` into ``data_dir`` after checking their md5."""
        raise NotImplementedError

    def local_archive_dir(self) -> Path:
        """Where torchvision's own download puts the original archives under ``data_dir``."""
        raise NotImplementedError

    def prepare_data(self) -> None:
        """Make sure intact files are under ``data_dir``; import or download them if missing.

        Sources, in order: files already extracted; ``source_dir``; the original archives where torchvision's
        own download leaves them (``<data_dir>/<Dataset>/raw/*.gz``, ``<data_dir>/cifar-10-python.tar.gz``),
        so data already on disk is never fetched again; a download when ``download`` is true.
        A failed import or download removes the folders it created.

        On storage shared by several nodes (Lightning runs ``prepare_data`` once per node) or several jobs,
        preparation is serialised by a lock file, ``<data_dir>/.prepare.lock`` (``filelock``; needs a file
        system with working ``flock``, as NFSv4 and most cluster file systems have): one process imports, the
        others wait, then find the files and only verify them.

        Raises:
            DataError: no source has the data, or a file is missing, truncated or fails its md5 check.
        """
        if self.predict_set is not None:  # classifying given image files needs nothing of the data set
            return
        if all(p.exists() for p in self.expected_files()):
            self.verify(md5=True)
            return
        with created_dirs(self.data_dir):  # a failure leaves no folder it created
            self.data_dir.mkdir(parents=True, exist_ok=True)
            with preparation_lock(self.data_dir):
                self._prepare_locked()

    def _prepare_locked(self) -> None:
        if not all(p.exists() for p in self.expected_files()):
            log.info("importing %s into %s", self.dataset_cls.__name__, self.data_dir)
            local = self.local_archive_dir()
            if self.source_dir is not None:
                if not self.source_dir.is_dir():
                    raise DataError(f"data.source_dir: {self.source_dir} is not a folder")
                self.import_archives(self.source_dir)
            elif all((local / name).is_file() for name in self.archive_names()):
                self.import_archives(local)
            elif self.hparams.download:
                with created_dirs(local):
                    self._download()
            else:
                missing = [str(p) for p in self.expected_files() if not p.exists()]
                raise DataError(
                    f"{self.dataset_cls.__name__} data not found: missing {', '.join(missing)}. "
                    "Set data.download: true, or data.source_dir to a folder holding "
                    f"{', '.join(self.archive_names())}; "
                    f"on a cluster whose training nodes have no network, prepare {self.data_dir} once before training "
                    "(docs/cluster.md, Data staging: the prepare Job, or the login-node line for SLURM)"
                )
        self.verify(md5=True)

    def _download(self) -> None:
        download_with_torchvision(self.dataset_cls, self.data_dir, self.archive_names())

    # -- datasets ------------------------------------------------------------------------------
    def make_dataset(self, train: bool, transform: Any) -> datasets.VisionDataset:
        return self.dataset_cls(str(self.data_dir), train=train, transform=transform, download=False)

    def eval_transform(self) -> Any:
        return T.Compose([T.ToTensor(), T.Normalize(self.mean, self.std)])

    def train_transform(self) -> Any:
        return self.eval_transform()

    as_tensors = staticmethod(loaders.as_tensors)

    def setup(self, stage: str | None = None) -> None:
        """Build the datasets and the seeded train/val split (idempotent; cheap file checks only); nothing when
        predicting on image files (:meth:`predict_on`)."""
        if self.train_set is not None or (stage == "predict" and self.predict_set is not None):
            return
        self.verify(md5=False)
        try:
            self.train_set = self.make_dataset(True, self.train_transform())
            self.val_set = self.make_dataset(True, self.eval_transform())
            self.test_set = self.make_dataset(False, self.eval_transform())
        except Exception as e:  # a file that passed the cheap checks above but does not load
            self.verify(md5=True)  # name the bad file if it is one
            raise DataError(f"could not load {self.dataset_cls.__name__} from {self.data_dir}: {e}; {FIX}") from None
        n = len(self.train_set)
        if self.hparams.folds is not None:
            self.split = fold_split(self.labels(), self.hparams.folds, self.hparams.fold, self.hparams.seed)
        else:
            fix = f"set --data.val_size below {n} (e.g. {max(n // 10, 1)}, a tenth)"
            self.split = holdout_split(n, self.hparams.val_size, self.hparams.seed, "training images", fix)
        if self.stats_from_data and not self._stats_loaded:
            self.mean, self.std = loaders.pixel_statistics(self.train_set.data, self.split[0])
        if self.stats_from_data:
            self._set_transforms()

    def _set_transforms(self) -> None:
        """The datasets' transforms for the current ``mean``/``std`` (the statistics the data decided)."""
        for dataset, transform in (
            (self.train_set, self.train_transform()),
            (self.val_set, self.eval_transform()),
            (self.test_set, self.eval_transform()),
        ):
            if dataset is not None:
                dataset.transform = transform

    def labels(self) -> torch.Tensor:
        """The class of each official training image, int64 (N,), from the data set's ``targets`` (torchvision's
        MNIST, Fashion-MNIST and CIFAR-10 hold them): what K folds are stratified by. All zeros (no stratification)
        for a data set without ``targets``."""
        assert self.train_set is not None  # set by setup()
        targets = getattr(self.train_set, "targets", None)
        if targets is None:
            return torch.zeros(len(self.train_set), dtype=torch.int64)  # type: ignore[arg-type]
        return torch.as_tensor(targets, dtype=torch.int64)

    # -- loaders -------------------------------------------------------------------------------
    def _world(self) -> tuple[int, int]:
        trainer = self.trainer
        return (trainer.world_size, trainer.global_rank) if trainer is not None else (1, 0)

    def _device(self) -> torch.device:
        trainer = self.trainer
        return trainer.strategy.root_device if trainer is not None else torch.device("cpu")

    def _memory_batches(self, stage: str) -> EpochBatches:
        if "train" not in self._tensors:
            assert self.split is not None  # set by setup(), which every *_dataloader hook calls first
            self._tensors = loaders.device_splits(self.train_set, self.test_set, self.split, self._device())
        images, targets = self._tensors[stage]
        train = stage == "train"
        return EpochBatches(
            images,
            targets,
            self._sampler(range(len(targets)), train),
            batch_size=self.hparams.batch_size if train else self.eval_batch_size,
            mean=self.mean,
            std=self.std,
            augment=train and self.augments(),
            drop_last=train and torch.backends.cudnn.benchmark,
        )

    def augments(self) -> bool:
        """Whether training batches are augmented (CIFAR-10 with ``augment: true`` only)."""
        return False

    @property
    def eval_batch_size(self) -> int:
        return self.hparams.eval_batch_size or self.hparams.batch_size

    def _loader(self, dataset: Dataset, sampler: Any, drop_last: bool = False, train: bool = False) -> DataLoader:
        hp = self.hparams
        batch_size = hp.batch_size if train else self.eval_batch_size
        return loaders.dataloader(
            dataset, sampler, batch_size, hp.num_workers, hp.pin_memory, hp.persistent_workers, drop_last, train
        )

    def _sampler(self, dataset: Any, train: bool) -> DistributedSampler:
        return loaders.sampler(dataset, train, *self._world(), seed=self.hparams.seed)

    def check_sizes(self) -> None:
        """Refuse splits that give no batches (after ``setup``); see :func:`project.data.loaders.check_sizes`.

        Raises:
            ConfigError: naming the sizes and the keys to change.
        """
        assert self.split is not None  # set by setup()
        loaders.check_sizes(len(self.split[0]), self._world()[0], self.hparams.batch_size, self.hparams.val_size)

    def train_dataloader(self) -> Any:
        """Shuffled training batches ``(x, y)``: x float32 (B, C, H, W) normalized, y int64 (B,).

        Raises:
            ConfigError: the split gives no training batch (see :meth:`check_sizes`).
        """
        self.setup("fit")
        self.check_sizes()
        loader: EpochBatches | ResumableLoader
        if self.hparams.in_memory:
            loader = self._memory_batches("train")
        else:
            assert self.train_set is not None and self.split is not None  # set by setup("fit") above
            subset = Subset(self.train_set, self.split[0].tolist())
            loader = cast(
                ResumableLoader,  # what _loader gives with train=True
                self._loader(subset, self._sampler(subset, True), drop_last=torch.backends.cudnn.benchmark, train=True),
            )
        loader.trainer = self.trainer
        if self._resume_batches:  # a mid-epoch checkpoint: start where it stopped (see project.data.resume)
            loader.load_state_dict({"batches": self._resume_batches})
            self._resume_batches = 0
        return loader

    def state_dict(self) -> dict[str, Any]:
        """Saved in every checkpoint: ``{"train_batches_done": n, "world_size": w}``, the batches of the unfinished
        epoch each of the ``w`` processes trained (a count per process: it means ``n * batch_size * w`` samples,
        and only under ``w`` processes, which is what a resume is checked against: :mod:`project.cli.gate`); with
        :attr:`stats_from_data`, also ``mean`` and ``std`` (lists, one float per channel)."""
        state: dict[str, Any] = {"train_batches_done": batches_done(self.trainer), "world_size": self._world()[0]}
        if self.stats_from_data:
            state |= {"mean": list(self.mean), "std": list(self.std)}
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume mid-epoch: the next training loader skips the batches already trained. With
        :attr:`stats_from_data`, take the checkpoint's ``mean``/``std`` (so evaluate, predict and export normalize
        as the net was trained, with or without the data).

        Raises:
            DataError: the statistics are not one number per channel (a positive one for ``std``).
        """
        self._resume_batches = int(state_dict.get("train_batches_done", 0))
        if not self.stats_from_data or "mean" not in state_dict:
            return
        mean, std, channels = state_dict.get("mean"), state_dict.get("std"), self.input_shape[0]
        values = [*mean, *std] if isinstance(mean, list) and isinstance(std, list) else []
        if len(values) != 2 * channels or not all(isinstance(x, float) for x in values) or min(values[channels:]) <= 0:
            raise DataError(
                f"the checkpoint's normalization statistics are not {channels} number(s) each: {mean}, {std}"
            )
        self.mean, self.std = tuple(values[:channels]), tuple(values[channels:])
        self._stats_loaded = True
        if self.train_set is not None:
            self._set_transforms()

    def _eval_loader(self, stage: str) -> Any:
        if self.hparams.in_memory:
            return self._memory_batches(stage)
        dataset: Dataset
        if stage == "val":
            assert self.split is not None  # set by setup()
            dataset = Subset(self.val_set, self.split[1].tolist())
        else:
            dataset = self.test_set
        return self._loader(dataset, self._sampler(dataset, False))

    def val_dataloader(self) -> Any:
        """Validation batches (never augmented), same format as training.

        Raises:
            ConfigError: ``val_size`` is 0 (the best checkpoint is chosen by ``val/acc``).
        """
        self.setup("fit")
        assert self.split is not None  # set by setup()
        if len(self.split[1]) == 0:
            raise ConfigError(
                "data.val_size: 0 leaves no validation images, but the best checkpoint is chosen by val/acc; "
                "set data.val_size >= 1 (or trainer.limit_val_batches: 0 to skip validation)"
            )
        return self._eval_loader("val")

    def test_dataloader(self) -> Any:
        """Official test-set batches (never augmented), same format as training."""
        self.setup("test")
        return self._eval_loader("test")

    def predict_on(self, files: Sequence[str | Path]) -> ImageFiles:
        """Make :meth:`predict_dataloader` serve these image files (folders expanded) instead of the test set.

        Returns:
            the :class:`ImageFiles` dataset; its ``refused`` lists the files that could not be read.

        Raises:
            ConfigError: a path does not exist.
        """
        self.predict_set = ImageFiles(image_files(files), self.input_shape, self.eval_transform(), self.resize)
        return self.predict_set

    def predict_dataloader(self) -> Any:
        """Batches for ``Trainer.predict``: the image files given to :meth:`predict_on`, as x float32
        (B, C, H, W) in their order, else the official test set as ``(x, y)`` like :meth:`test_dataloader`."""
        if self.predict_set is None:
            return self.test_dataloader()
        return self._loader(self.predict_set, self._sampler(self.predict_set, False))

    @property
    def classes(self) -> list[str]:
        return list(self.dataset_cls.classes)
