"""``ImageFolderDataModule``: a folder of your own images, laid out as torchvision's ``ImageFolder`` reads it.

Layout under ``data_dir``::

    train/<class>/<image>     required; the classes are the sub-folders of train/, sorted (ImageFolder's rule)
    val/<class>/<image>       optional: the validation set; without it, val_size images (or data.folds) are split
                              off train/ with the seeded split every data module uses
    test/<class>/<image>      optional: the test set; without it, the test step reports on the validation images

Image files are recognised by their suffix (:data:`project.data.images.IMAGE_SUFFIXES`); other files (a README,
``.DS_Store``) are skipped and counted. Each image is read as a person sees it, by the rules ``predict`` follows
(:func:`project.data.images.as_seen`: EXIF orientation, 16-bit, transparency over white), converted to ``channels``
(1: grayscale, 3: RGB) and brought to ``image_size`` x ``image_size`` by ``resize``:

* ``stretch`` (default): the whole picture scaled to the square, aspect ratio not kept. The default because it is
  what ``predict`` has always done with a file of another size, and it never drops a part of the picture;
* ``crop``: scaled to cover the square, then the centre cut out (torchvision's ``Resize`` + ``CenterCrop``);
* ``pad``: scaled to fit inside the square, the rest filled with black (torchvision's ``Pad`` fill 0).

Images are decoded once into one uint8 array (N, H, W) or (N, H, W, 3) and cached on disk under
``data_dir/.cache/``, keyed by every image's path, size and modification time and by the decode settings: an added,
removed or changed file, or other settings, build a new cache; a cache that does not load, or holds another key, is
rebuilt, never trusted (it is read with ``torch.load(weights_only=True)``; its arrays must have the settings' shape).
The key names the files, not their pixels, and a cache planted in a folder from elsewhere can carry it: on every
load :data:`CACHE_SPOT_CHECKS` images of each split, drawn afresh, are decoded again and must equal the cache's
pixels exactly, else the cache is rebuilt (a cache replacing a tenth of the images is caught with probability
0.9988; one replacing them all, always).
Later runs, and ``in_memory: true``, read the cache only. The :data:`CACHES_KEPT` most recently used caches are
kept, older ones removed.

Normalization statistics (per-channel mean and std, of pixel values in [0, 1]) come from the training split only
(the train/ images left after the validation split or fold), and travel in the checkpoint with the class names, so
that evaluate, predict and export use the numbers the net was trained with.

A bad folder is one :class:`~project.errors.DataError` naming it: train/ missing, fewer than two classes, an empty
class folder, a class in val/ or test/ that train/ lacks, an image that does not decode or is over
:data:`project.data.images.MAX_PIXELS` pixels (refused, not skipped: a training set silently missing images is a
different experiment).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from jsonargparse.typing import NonNegativeInt, PositiveInt
from PIL import Image
from torch.utils.data import Dataset
from torchvision import datasets
from torchvision import transforms as T

from project.adapters import to_builtin
from project.data.base import DEFAULT_DATA_DIR, VisionDataModule
from project.data.folds import fold_split, holdout_split
from project.data.images import IMAGE_SUFFIXES, load_images
from project.errors import ConfigError, DataError, UserError

log = logging.getLogger(__name__)

CACHE_FORMAT = 1  # bump when what the cache holds changes: older caches are then rebuilt
CACHES_KEPT = 3  # image caches kept per folder (the most recently used)
CACHE_SPOT_CHECKS = 64  # images per split decoded again on every cache load and compared with the cache
SPLITS = ("train", "val", "test")
Resize = Literal["stretch", "crop", "pad"]


def find_classes(folder: Path) -> list[str]:
    """The class names under ``folder``: its sub-folders, sorted, hidden ones (``.name``) left out.

    Raises:
        DataError: ``folder`` is missing or not a folder, or holds fewer than two classes.
    """
    if not folder.is_dir():
        raise DataError(
            f"{folder} is missing: ImageFolderDataModule reads <data_dir>/train/<class>/<image> (docs/own-images.md); "
            "set data.data_dir to the folder holding train/"
        )
    classes = sorted(p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
    if len(classes) < 2:
        raise DataError(f"{folder}: {len(classes)} class folder(s) {classes}; a classifier needs at least two")
    return classes


def class_files(folder: Path) -> tuple[list[Path], int]:
    """The image files under one class ``folder`` (recursively, sorted) and the number of entries skipped: files
    that are not images by their suffix, anything hidden (a ``.name`` file or folder at any depth, as
    ``.thumbs/``), and linked folders inside the class (not followed: a link can point anywhere, and a loop never
    ends). A class folder that is itself a link is read."""
    images: list[Path] = []
    skipped = 0
    for path in sorted(folder.rglob("*")):
        if path.is_symlink() and path.is_dir():
            skipped += 1  # not descended into
        elif path.is_file():
            hidden = any(part.startswith(".") for part in path.relative_to(folder).parts)
            if hidden or path.suffix.lower() not in IMAGE_SUFFIXES:
                skipped += 1
            else:
                images.append(path)
    return images, skipped


def list_images(folder: Path, classes: list[str], split: str) -> tuple[list[Path], list[int], int]:
    """The image files of ``folder/<class>/`` (:func:`class_files`) for each class it has, their class indices, and
    the number of entries skipped.

    Raises:
        DataError: ``folder`` holds no class folder (a ``val/`` or ``test/`` left empty), a class folder that
            ``classes`` (train/'s) lacks, or a class folder without images.
    """
    present = sorted(p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not present:
        raise DataError(
            f"{folder}: no class folders; fill it as train/ (<class>/<image>) or remove it ({split}/ is optional)"
        )
    unknown = [c for c in present if c not in classes]
    if unknown:
        raise DataError(
            f"{folder}: class folder(s) {unknown} are not in train/ ({classes}); the net has one output per train/ "
            "class"
        )
    files: list[Path] = []
    targets: list[int] = []
    skipped = 0
    for name in present:
        images, n = class_files(folder / name)
        skipped += n
        if not images:
            suffixes = ", ".join(sorted(IMAGE_SUFFIXES))
            raise DataError(f"{folder / name}: no image files ({suffixes}) in this {split} class")
        files += images
        targets += [classes.index(name)] * len(images)
    return files, targets, skipped


def prune_caches(folder: Path, keep: int = CACHES_KEPT) -> None:
    """Remove all but the ``keep`` most recently used image caches of ``folder`` (each file list and each decode
    setting has its own, and an edited folder would otherwise leave every earlier cache behind)."""
    caches = sorted(folder.glob("images-*.pt"), key=lambda p: p.stat().st_mtime_ns, reverse=True)
    for old in caches[keep:]:
        old.unlink(missing_ok=True)


class FolderImages(Dataset):
    """Decoded images as torchvision's in-memory data sets hold them: ``data`` uint8 (N, H, W) or (N, H, W, 3),
    ``targets`` (N,) class indices; ``self[i]`` is ``(transform(PIL image), target)``."""

    def __init__(self, data: np.ndarray, targets: list[int], transform: Any = None) -> None:
        self.data, self.targets, self.transform = data, targets, transform

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, i: int) -> tuple[Any, int]:
        image = Image.fromarray(self.data[i])
        return (self.transform(image) if self.transform is not None else image), self.targets[i]


class ImageFolderDataModule(VisionDataModule):
    """Your own images in ``data_dir/{train,val,test}/<class>/`` (torchvision's ``ImageFolder`` layout); see the
    module docstring for the layout, the decode rules, the cache and the errors.

    Args:
        data_dir: the folder holding ``train/`` (and optionally ``val/``, ``test/``).
        channels: 1 (grayscale: LeNet) or 3 (RGB: SimpleCNN); images of other modes are converted.
        image_size: the side of the square the nets take, in pixels (LeNet 28, SimpleCNN 32).
        resize: how a picture of another size is brought to the square: ``stretch``, ``crop`` or ``pad``.
        val_size: images split off train/ for validation when there is no ``val/``; default (unset): a tenth of
            them (at least one). A number is taken as written (5000 too).
        classes: the class names by index; default (unset): train/'s sub-folders, sorted. A run records them in its
            config.yaml, so that predict and export need no image folder; with ``train/`` present they must be its
            sub-folders.
        download, source_dir: ignored (there is nothing to download or import: the folder is the source); taken
            because the run-folder commands and cluster jobs pass them to every data module.
        The other arguments are :class:`~project.data.base.VisionDataModule`'s.

    Attributes:
        classes: class names by index (train/'s sub-folders, sorted); ``num_classes`` its length.
        mean, std: per-channel statistics of the training split (after ``setup``, or from a checkpoint).

    Raises:
        DataError: see the module docstring; ConfigError: ``folds`` or ``val_size`` together with a ``val/``
            folder, or a bad ``val_size``.
    """

    dataset_cls = datasets.ImageFolder  # the layout it reads (named in messages); decoding is this module's own
    # images split off train/ by data.val_size (after setup; None with val/ or folds): what config.yaml records for
    # an unset val_size, so that the run folder's config says how many images validated
    split_off: int | None = None

    def __init__(
        self,
        data_dir: str = DEFAULT_DATA_DIR,
        channels: Literal[1, 3] = 3,
        image_size: PositiveInt = 32,
        resize: Resize = "stretch",
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
        classes: list[str] | None = None,
        download: bool = False,
        source_dir: str | None = None,
    ) -> None:
        super().__init__(
            data_dir=data_dir,
            download=False,  # nothing to download: the folder is the source
            batch_size=batch_size,
            eval_batch_size=eval_batch_size,
            num_workers=num_workers,
            pin_memory=pin_memory,
            persistent_workers=persistent_workers,
            val_size=val_size,
            folds=folds,
            fold=fold,
            seed=seed,
            in_memory=in_memory,
        )
        self.save_hyperparameters(logger=False)
        to_builtin(self.hparams)
        self.input_shape = (int(channels), int(image_size), int(image_size))
        if classes is None:
            self._classes = find_classes(self.data_dir / "train")
        elif len(set(classes)) < 2 or len(set(classes)) != len(classes):
            raise ConfigError(f"data.classes: {classes}; give two or more distinct class names, or leave it unset")
        else:
            self._classes = list(classes)
        self.num_classes = len(self._classes)
        self.mean = (0.5,) * channels  # until setup (or a checkpoint) gives the training split's own
        self.std = (0.5,) * channels
        self.resize = resize
        self.skipped = 0
        self._prepared: dict[str, tuple[np.ndarray, list[int]]] | None = None

    @property
    def classes(self) -> list[str]:
        return list(self._classes)

    # -- files and the cache -------------------------------------------------------------------
    def _listing(self) -> dict[str, tuple[list[Path], list[int]]]:
        found = find_classes(self.data_dir / "train")
        if found != self._classes:
            raise DataError(
                f"data.classes: {self._classes}, but {self.data_dir}/train holds {found}; give the run's own image "
                "folder (--data.data_dir), or leave data.classes unset"
            )
        listing = {}
        skipped = 0
        for split in SPLITS:
            folder = self.data_dir / split
            if split == "train" or folder.is_dir():
                files, targets, n = list_images(folder, self._classes, split)
                listing[split] = (files, targets)
                skipped += n
        self.skipped = skipped
        return listing

    def _key(self, listing: dict[str, tuple[list[Path], list[int]]]) -> str:
        entries = []
        for split, (files, targets) in listing.items():
            for path, target in zip(files, targets):
                st = path.stat()
                entries.append([split, str(path.relative_to(self.data_dir)), target, st.st_size, st.st_mtime_ns])
        what = [CACHE_FORMAT, list(self.input_shape), self.resize, self._classes, entries]
        return hashlib.sha256(json.dumps(what).encode()).hexdigest()

    def _cache_path(self, key: str) -> Path:
        return self.data_dir / ".cache" / f"images-{key[:24]}.pt"

    def _decode(self, files: list[Path]) -> np.ndarray:
        channels, height, width = self.input_shape
        mode = "L" if channels == 1 else "RGB"
        out = np.empty((len(files), height, width, channels), dtype=np.uint8)
        for i, (_, image) in enumerate(load_images(files, mode, (width, height), self.resize)):
            if isinstance(image, UserError):
                raise DataError(
                    f"{image}; fix or remove the file (a training set missing images is another experiment)"
                ) from None
            out[i] = np.asarray(image).reshape(height, width, channels)
        return out[..., 0] if channels == 1 else out

    def _spot_check(
        self,
        path: Path,
        splits: dict[str, tuple[np.ndarray, list[int]]],
        listing: dict[str, tuple[list[Path], list[int]]],
    ) -> bool:
        """Whether :data:`CACHE_SPOT_CHECKS` images of each split, drawn afresh (OS entropy) on every load, decode to
        exactly the cached pixels. The key (paths, sizes, modification times) says which files a cache was written
        for, not that its pixels are theirs: a cache planted in a data folder from elsewhere passes the key. A cache
        that replaces a fraction f of the images fails this check with probability at least 1 - (1 - f)^k (k
        images drawn): certainly when it replaces them all, 0.9988 at f = 10 %, k = 64."""
        rng = np.random.default_rng()
        for split, (data, _) in splits.items():
            files = listing[split][0]
            picks = rng.choice(len(files), size=min(CACHE_SPOT_CHECKS, len(files)), replace=False)
            if not np.array_equal(self._decode([files[i] for i in picks]), data[picks]):
                log.warning("rebuilding the image cache %s (its pixels are not those of the %s images)", path, split)
                return False
        return True

    def _load_cache(self, path: Path, key: str) -> dict[str, Any] | None:
        try:
            cached = torch.load(path, map_location="cpu", weights_only=True)
        except FileNotFoundError:
            return None
        except Exception as e:  # noqa: BLE001  # anything unreadable is rebuilt, never trusted
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            log.warning("rebuilding the image cache %s (%s: %s)", path, type(e).__name__, first)
            return None
        if not (isinstance(cached, dict) and cached.get("key") == key):
            log.warning("rebuilding the image cache %s (it was written for other files or settings)", path)
            return None
        return cached

    def _decoded(self) -> dict[str, tuple[np.ndarray, list[int]]]:
        """Every split's images, from the cache when it holds these files with these settings, else decoded (and
        the cache written: a temporary file renamed into place, so a reader never sees half of one)."""
        listing = self._listing()
        if self.skipped:
            log.info(
                "skipped %d entries under %s: not images by suffix, hidden, or linked folders",
                self.skipped,
                self.data_dir,
            )
        key = self._key(listing)
        path = self._cache_path(key)
        cached = self._load_cache(path, key)
        shape = self.input_shape

        def expected(n: int) -> tuple[int, ...]:  # (N, H, W) or (N, H, W, 3), as _decode writes it
            return (n, shape[1], shape[2]) if shape[0] == 1 else (n, shape[1], shape[2], shape[0])

        if cached is not None:
            splits = {}
            for split, (files, targets) in listing.items():
                data = cached.get(split)
                if (
                    not isinstance(data, torch.Tensor)
                    or data.dtype != torch.uint8
                    or data.shape != expected(len(files))
                ):
                    cached = None
                    break
                splits[split] = (data.numpy(), targets)
            if cached is not None and not self._spot_check(path, splits, listing):
                cached = None
            if cached is not None:
                os.utime(path)  # recently used: kept when older caches are pruned
                return splits
        log.info(
            "decoding %s images under %s (%dx%dx%d, %s)",
            sum(len(f) for f, _ in listing.values()),
            self.data_dir,
            *shape,
            self.resize,
        )
        splits = {split: (self._decode(files), targets) for split, (files, targets) in listing.items()}
        path.parent.mkdir(parents=True, exist_ok=True)
        payload = {"key": key, **{split: torch.from_numpy(data) for split, (data, _) in splits.items()}}
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".images-", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                torch.save(payload, f)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        prune_caches(path.parent)
        return splits

    # -- the VisionDataModule hooks --------------------------------------------------------------
    def expected_files(self) -> list[Path]:
        return [self.data_dir / "train"]

    def archive_names(self) -> list[str]:
        return []

    def local_archive_dir(self) -> Path:
        return self.data_dir

    def verify(self, md5: bool = True) -> None:
        find_classes(self.data_dir / "train")

    def prepare_data(self) -> None:
        """Check the folders and build the image cache (once per node; ``setup`` then reads the cache).

        Raises:
            DataError: see the module docstring.
        """
        if self.predict_set is None:
            self._prepared = self._decoded()  # setup in this process takes them (other processes read the cache)

    def setup(self, stage: str | None = None) -> None:
        """The decoded splits, the train/val split (``val/``, else seeded, else a fold) and the training split's
        normalization statistics (idempotent)."""
        if self.train_set is not None or (stage == "predict" and self.predict_set is not None):
            return
        splits = self._prepared or self._decoded()
        self._prepared = None
        train, train_targets = splits["train"]
        hp = self.hparams
        if "val" in splits:
            if hp.folds is not None:
                raise ConfigError(
                    f"data.folds: {self.data_dir}/val exists; folds split train/ alone, remove val/ or folds"
                )
            if hp.val_size is not None:
                raise ConfigError(
                    f"data.val_size: {hp.val_size} with {self.data_dir}/val, which is the validation set; drop "
                    "data.val_size, or remove val/ to split train/"
                )
            val, val_targets = splits["val"]
            images, targets = np.concatenate([train, val]), train_targets + val_targets
            n = len(train_targets)
            self.split = (torch.arange(n), torch.arange(n, n + len(val_targets)))
        else:
            images, targets = train, train_targets
            n = len(targets)
            if hp.folds is not None:
                self.split = fold_split(torch.as_tensor(targets), hp.folds, hp.fold, hp.seed)
            else:
                tenth = max(n // 10, 1)
                val_size = hp.val_size if hp.val_size is not None else tenth  # unset: a tenth of train/
                fix = f"set --data.val_size below {n}, or drop it for a tenth ({tenth})"
                self.split = holdout_split(n, val_size, hp.seed, "images of train/", fix)
                self.split_off = val_size
            hp.val_size = len(self.split[1])
        pixels = torch.from_numpy(images[self.split[0].numpy()]).to(torch.float64) / 255
        self.mean = tuple(float(v) for v in pixels.mean(dim=(0, 1, 2)).reshape(-1))  # (N, H, W[, C]): per channel
        self.std = tuple(float(v) or 1.0 for v in pixels.std(dim=(0, 1, 2), correction=0).reshape(-1))
        self.train_set = FolderImages(images, targets)
        self.val_set = FolderImages(images, targets)
        if "test" in splits:
            self.test_set = FolderImages(*splits["test"])
        else:
            if not len(self.split[1]):
                raise ConfigError(
                    f"data.val_size: 0 and no {self.data_dir}/test folder leave no images to test on; add test/ "
                    "(<class>/<image>), or keep some validation images"
                )
            log.warning("no %s/test folder: the test step reports on the validation images", self.data_dir)
            val_idx = self.split[1].numpy()
            self.test_set = FolderImages(images[val_idx], [targets[i] for i in val_idx])
        self._set_transforms()

    def _set_transforms(self) -> None:
        for dataset, transform in (
            (self.train_set, self.train_transform()),
            (self.val_set, self.eval_transform()),
            (getattr(self, "test_set", None), self.eval_transform()),
        ):
            if dataset is not None:
                dataset.transform = transform

    def eval_transform(self) -> Any:
        return T.Compose([T.ToTensor(), T.Normalize(self.mean, self.std)])

    def labels(self) -> torch.Tensor:
        assert self.train_set is not None  # set by setup()
        return torch.as_tensor(self.train_set.targets, dtype=torch.int64)

    # -- what travels in the checkpoint -----------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """:class:`VisionDataModule`'s, plus ``classes`` (names by index), ``mean`` and ``std`` (per channel)."""
        return {**super().state_dict(), "classes": list(self._classes), "mean": list(self.mean), "std": list(self.std)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Take the checkpoint's normalization statistics; its classes must be this folder's.

        Raises:
            DataError: the checkpoint's classes differ from train/'s, or its statistics are not one positive
                number per channel.
        """
        super().load_state_dict(state_dict)
        classes, mean, std = state_dict.get("classes"), state_dict.get("mean"), state_dict.get("std")
        if classes is None:
            return
        if classes != self._classes:
            raise DataError(
                f"the checkpoint was trained on classes {classes}, {self.data_dir}/train holds {self._classes}; "
                "give the run's own image folder (--data.data_dir)"
            )
        channels = self.input_shape[0]
        ok = all(
            isinstance(v, list) and len(v) == channels and all(isinstance(x, float) for x in v) for v in (mean, std)
        )
        if not (ok and isinstance(mean, list) and isinstance(std, list) and all(x > 0 for x in std)):
            raise DataError(
                f"the checkpoint's normalization statistics are not {channels} number(s) each: {mean}, {std}"
            )
        self.mean, self.std = tuple(mean), tuple(std)
        if self.train_set is not None:
            self._set_transforms()
