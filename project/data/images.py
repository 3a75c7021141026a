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

import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageOps, UnidentifiedImageError
from torch.utils.data import Dataset

from project.errors import ConfigError, UserError

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp"}
# The formats Pillow may identify a file as, whatever its name: the documented ones only. Without ``formats=``
# Pillow tries every plugin it has, EPS among them, which starts Ghostscript on a PostScript file named cat.png.
IMAGE_FORMATS = ("PNG", "JPEG", "BMP", "GIF", "WEBP", "TIFF", "PPM")  # PPM: also PGM, PBM
MAX_PIXELS = 4096 * 4096  # far above any recipe input; refused before decoding
BACKGROUND = "white"  # what transparent pixels are composited over
_SIXTEEN_BIT = {"I;16", "I;16L", "I;16B", "I;16N", "I"}
_ALPHA = {"LA", "La", "PA", "RGBA", "RGBa"}


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


def as_seen(img: Image.Image) -> Image.Image:
    """``img`` as a person sees it, as an 8-bit ``L`` or ``RGB`` image of the same size after EXIF rotation.

    16-bit modes are scaled (65535 -> 255, rounded), ``F`` is taken as 0.0..1.0, transparency is composited over
    :data:`BACKGROUND`, EXIF orientation is applied; see the module docstring.

    Raises:
        ValueError, OSError: Pillow cannot convert this mode.
    """
    img = ImageOps.exif_transpose(img)
    if img.mode in _SIXTEEN_BIT:
        wide = img.convert("I")
        img = wide.point(lambda v: v * (255 / 65535) + 0.5).convert("L")  # convert("L") clips
        if isinstance(key := wide.info.get("transparency"), int):  # a 16-bit transparent value: alpha from it
            img.info.pop("transparency", None)
            img.putalpha(Image.fromarray((np.asarray(wide) != key).astype(np.uint8) * 255))
    elif img.mode == "F":
        img = img.point(lambda v: v * 255).convert("L")  # F -> L rounds and clips
    if img.mode in _ALPHA or "transparency" in img.info:
        rgba = img.convert("RGBA")
        img = Image.alpha_composite(Image.new("RGBA", rgba.size, BACKGROUND), rgba).convert("RGB")
    if img.mode not in ("L", "RGB"):
        img = img.convert("L" if img.mode in ("1", "L") else "RGB")  # "1" -> 0/255; P, CMYK, YCbCr -> RGB
    return img


def fit_to(img: Image.Image, size: tuple[int, int], resize: str = "stretch") -> Image.Image:
    """``img`` brought to ``size`` (W, H), bilinear: ``stretch`` scales the whole picture (aspect ratio not kept);
    ``crop`` scales it to cover ``size`` and cuts out the centre (torchvision's ``Resize`` + ``CenterCrop``); ``pad``
    scales it to fit inside and fills the rest with black (torchvision's ``Pad``, fill 0)."""
    if resize == "crop":
        return ImageOps.fit(img, size, Image.Resampling.BILINEAR)
    if resize == "pad":
        return ImageOps.pad(img, size, Image.Resampling.BILINEAR, color=0)
    return img.resize(size, Image.Resampling.BILINEAR)


def load_image(path: Path, mode: str, size: tuple[int, int], resize: str = "stretch") -> Image.Image:
    """Open ``path`` as a ``mode`` (``L`` or ``RGB``) image of ``size`` (W, H) pixels, as a person sees it
    (:func:`as_seen`), brought to that size by ``resize`` (:func:`fit_to`). The file is closed on return.

    Raises:
        UserError: not an image in one of :data:`IMAGE_FORMATS` (whatever its name says), truncated, or more than
            :data:`MAX_PIXELS` pixels.
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(path, formats=IMAGE_FORMATS) as img:
                if img.width * img.height > MAX_PIXELS:
                    raise UserError(f"{path}: {img.width}x{img.height} pixels is more than {MAX_PIXELS}; refused")
                img.load()
                return fit_to(as_seen(img).convert(mode), size, resize)
    except UnidentifiedImageError:
        raise UserError(f"{path}: not an image in a format predict reads ({', '.join(IMAGE_FORMATS)})") from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise UserError(f"{path}: refused as a decompression bomb ({e})") from None
    except (OSError, SyntaxError, ValueError) as e:
        raise UserError(f"{path}: unreadable image ({e})") from None


class ImageFiles(Dataset):
    """Readable image files as float tensors (C, H, W), read one file at a time.

    Building the dataset reads every file once, in order, to sort the readable from the refused; only the paths
    are kept. ``self[i]`` reads ``files[i]`` again (in a DataLoader worker when there are workers), so memory and
    open files stay bounded whatever the number of files, and pickling the dataset to workers sends paths only.

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
        for path in map(Path, files):
            try:
                load_image(path, self.mode, self.size, self.resize)
            except UserError as e:
                self.refused.append((path, str(e)))
                continue
            self.files.append(path)

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.transform(load_image(self.files[i], self.mode, self.size, self.resize))
