"""Image files from elsewhere as a dataset for ``Trainer.predict`` (used by ``python -m project.predict``).

Each file is treated as hostile input: a file that is not an image, is truncated, or declares more than
:data:`MAX_PIXELS` pixels (a "decompression bomb") is refused with a reason naming it, before any pixel is
decoded where possible; the other files are still served. Accepted images are converted to the data's
mode (grayscale ``L`` for MNIST/Fashion-MNIST, ``RGB`` for CIFAR-10), resized to its H x W (bilinear) and
passed through the data module's own evaluation transform (``ToTensor`` + ``Normalize``), so they reach the
net exactly as the run's test images do.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from PIL import Image, UnidentifiedImageError
from torch.utils.data import Dataset

from project.errors import ConfigError, UserError

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp"}
MAX_PIXELS = 4096 * 4096  # far above any recipe input; refused before decoding


def image_files(inputs: Sequence[str | Path]) -> list[Path]:
    """The files named, plus the image files (by suffix, :data:`IMAGE_SUFFIXES`) under each folder named,
    recursively, sorted.

    Raises:
        ConfigError: an input does not exist.
    """
    files: list[Path] = []
    for spec in inputs:
        path = Path(spec)
        if path.is_dir():
            files += sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
        elif path.is_file():
            files.append(path)
        else:
            raise ConfigError(f"{spec} does not exist; give image files or folders of them")
    return files


def load_image(path: Path, mode: str, size: tuple[int, int]) -> Image.Image:
    """Open ``path`` as a ``mode`` image of ``size`` (W, H) pixels.

    Raises:
        UserError: not an image, truncated, or more than :data:`MAX_PIXELS` pixels.
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(path) as img:
                if img.width * img.height > MAX_PIXELS:
                    raise UserError(f"{path}: {img.width}x{img.height} pixels is more than {MAX_PIXELS}; refused")
                img.load()
                return img.convert(mode).resize(size, Image.Resampling.BILINEAR)
    except UnidentifiedImageError:
        raise UserError(f"{path}: not an image PIL can read") from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise UserError(f"{path}: refused as a decompression bomb ({e})") from None
    except (OSError, SyntaxError, ValueError) as e:
        raise UserError(f"{path}: unreadable image ({e})") from None


class ImageFiles(Dataset):
    """Readable image files as float tensors (C, H, W), decoded once when the dataset is built.

    Args:
        files: image paths (see :func:`image_files` to expand folders).
        input_shape: (C, H, W) the net takes; C = 1 gives grayscale, 3 RGB.
        transform: PIL image -> float tensor (C, H, W), the data module's ``eval_transform()``.

    Attributes:
        files: the accepted files, in order (``self[i]`` is ``files[i]``).
        refused: ``(path, reason)`` for every file that could not be read.
    """

    def __init__(self, files: Sequence[Path], input_shape: tuple[int, int, int], transform: Callable) -> None:
        channels, height, width = input_shape
        mode = "L" if channels == 1 else "RGB"
        self.files: list[Path] = []
        self.refused: list[tuple[Path, str]] = []
        self._images: list[torch.Tensor] = []
        for path in files:
            try:
                image = load_image(Path(path), mode, (width, height))
            except UserError as e:
                self.refused.append((Path(path), str(e)))
                continue
            self.files.append(Path(path))
            self._images.append(transform(image))

    def __len__(self) -> int:
        return len(self._images)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self._images[i]
