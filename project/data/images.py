"""Image files from elsewhere as a dataset for ``Trainer.predict`` (used by ``python -m project.predict``).

Each file is treated as hostile input: a file that is not an image, is truncated, or declares more than
:data:`MAX_PIXELS` pixels (a "decompression bomb") is refused with a reason naming it, before any pixel is
decoded where possible; the other files are still served.

An image is read as a person sees it, whatever its mode (:func:`as_seen`, Pillow's public API only):

* EXIF orientation is applied (``ImageOps.exif_transpose``), as photo viewers do;
* 16-bit images (modes ``I;16``, ``I;16B``, ``I;16L``, and ``I``, which Pillow uses for 16-bit PGM/PPM) are
  scaled from 0..65535 to 0..255 (rounded; Pillow's own ``convert`` clips them, so 16-bit ``1000`` became white);
  larger ``I`` values are clipped. Float images (``F``) are taken as 0.0 (black) .. 1.0 (white), as image editors
  and scikit-image show them;
* transparent pixels (``LA``, ``RGBA``, ``PA``, palette or single-colour ``transparency``) are composited over
  **white**, the background a browser or a document shows them on;
* palette (``P``), 1-bit (``1``), ``CMYK`` and ``YCbCr`` images are converted with Pillow's ``convert``.

The picture is then converted to the data's mode (grayscale ``L`` for MNIST/Fashion-MNIST, ``RGB`` for
CIFAR-10; ``RGB`` -> ``L`` by ITU-R 601-2 luma, Pillow's ``convert``), resized to its H x W (bilinear; stretched,
or cropped or padded as an image-folder data module's ``resize`` says: :func:`fit_to`) and passed
through the data module's own evaluation transform (``ToTensor`` + ``Normalize``), so it reaches the net exactly
as the run's test images do. The same picture saved as a plain 8-bit ``L``/``RGB`` PNG gives the same tensor.

Files are opened one at a time and closed at once; :class:`ImageFiles` keeps only their paths, and decodes each
again when a DataLoader (or its worker process) asks for it, so any number of files takes bounded memory and
open files.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from torch.utils.data import Dataset

# Re-exported: where the decoding lives (light, for its helper process) and its limits.
from project.decode import (  # noqa: F401
    BACKGROUND,
    DECODE_TIMEOUT_S,
    IMAGE_FORMATS,
    MAX_PIXELS,
    as_seen,
    fit_to,
    load_images,
    open_image,
)
from project.errors import ConfigError, UserError

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp"}


def image_files(inputs: Sequence[str | Path]) -> list[Path]:
    """The files named, plus the image files (by suffix, :data:`IMAGE_SUFFIXES`) under each folder named,
    recursively, sorted; ``~`` is the home folder.

    Raises:
        ConfigError: an input does not exist.
    """
    files: list[Path] = []
    for spec in inputs:
        path = Path(spec).expanduser()
        if path.is_dir():
            files += sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
        elif path.is_file():
            files.append(path)
        else:
            raise ConfigError(f"{spec} does not exist; give image files or folders of them")
    return files


class ImageFiles(Dataset):
    """Readable image files as float tensors (C, H, W), read one file at a time.

    Building the dataset reads every file once, in order, to sort the readable from the refused (decoded within
    :data:`DECODE_TIMEOUT_S` seconds each: :func:`load_images`); only the paths are kept. ``self[i]`` reads
    ``files[i]`` again (in a DataLoader worker when there are workers), so memory and open files stay bounded
    whatever the number of files, and pickling the dataset to workers sends paths only.

    Args:
        files: image paths (see :func:`image_files` to expand folders).
        input_shape: (C, H, W) the net takes; C = 1 gives grayscale, 3 RGB.
        transform: PIL image -> float tensor (C, H, W), the data module's ``eval_transform()``.
        resize: how a picture of another size reaches (H, W): :func:`fit_to` (the data module's ``resize``).

    Attributes:
        files: the accepted files, in order (``self[i]`` is ``files[i]``).
        refused: ``(path, reason)`` for every file that could not be read.

    Raises:
        UserError: from ``self[i]``, when an accepted file became unreadable since the dataset was built.
    """

    def __init__(
        self, files: Sequence[Path], input_shape: tuple[int, int, int], transform: Callable, resize: str = "stretch"
    ) -> None:
        channels, height, width = input_shape
        self.resize = resize
        self.mode = "L" if channels == 1 else "RGB"
        self.size = (width, height)
        self.transform = transform
        self.files: list[Path] = []
        self.refused: list[tuple[Path, str]] = []
        for path, image in load_images(map(Path, files), self.mode, self.size, self.resize):
            if isinstance(image, UserError):
                self.refused.append((path, str(image)))
            else:
                self.files.append(path)

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> torch.Tensor:
        # in this process (a DataLoader worker may start no helper): the file decoded within the bound at the scan
        return self.transform(open_image(self.files[i], self.mode, self.size, self.resize))
