"""Device-resident batches: a whole split kept as one uint8 tensor, batched with tensor ops.

The data modules' ``in_memory: true`` path (see :class:`EpochBatches`); it replaces a per-sample
torchvision ``DataLoader`` (PIL decode, ``ToTensor``, ``Normalize`` per image, worker processes) with one
index and a few batched ops per step.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
from torch.utils.data import DistributedSampler

from project.data.resume import ResumableState


class EpochBatches(ResumableState):
    """Batches of a uint8 image tensor kept in memory (RAM, or GPU memory when training on a GPU).

    The whole split is decoded once into ``images`` (N, C, H, W) uint8 and ``targets`` (N,) int64 on
    one device. The order of each epoch comes from ``sampler`` -- a ``DistributedSampler`` (fresh
    permutation from ``seed + epoch``, every sample once per epoch, each DDP rank its own shard) or,
    for evaluation, Lightning's ``UnrepeatedDistributedSampler``. Lightning calls
    ``sampler.set_epoch`` each epoch as it does for a DataLoader. Batches are converted to float,
    normalized and -- if ``augment`` -- randomly cropped (4-pixel zero padding) and flipped with
    batched tensor ops: no per-sample Python and no worker processes.

    As a training loader it resumes mid-epoch exactly (:class:`~project.data.resume.ResumableState`).

    Yields:
        ``(x, y)``: x float32 (B, C, H, W) normalized, y int64 (B,), on ``images.device``.
    """

    def __init__(
        self,
        images: torch.Tensor,
        targets: torch.Tensor,
        sampler: DistributedSampler,
        batch_size: int,
        mean: tuple[float, ...],
        std: tuple[float, ...],
        augment: bool = False,
        drop_last: bool = False,
    ) -> None:
        self.images, self.targets, self.sampler = images, targets, sampler
        self.batch_sampler = None  # DataLoader-like attributes that Lightning's loops look for
        self.batch_size, self.augment, self.drop_last = batch_size, augment, drop_last
        shape = (1, -1, 1, 1)
        # Normalize uint8 values directly: (x / 255 - mean) / std == (x - 255 mean) / (255 std).
        self.mean = torch.tensor(mean, device=images.device).view(shape) * 255
        self.std = torch.tensor(std, device=images.device).view(shape) * 255

    def __len__(self) -> int:
        m = len(self.sampler)
        return m // self.batch_size if self.drop_last else math.ceil(m / self.batch_size)

    @staticmethod
    def random_crop_flip(x: torch.Tensor, padding: int = 4) -> torch.Tensor:
        """torchvision's ``RandomCrop(size, padding)`` + ``RandomHorizontalFlip()`` for a whole batch.

        Args:
            x: images (N, C, H, W), any dtype; padding is zeros, as torchvision pads the uint8 image.

        Returns:
            Tensor of the same shape and dtype, each image cropped at its own random offset and flipped
            left-right with probability 0.5.
        """
        n, c, h, w = x.shape
        dev = x.device
        padded = torch.nn.functional.pad(x, (padding,) * 4)
        dy = torch.randint(0, 2 * padding + 1, (n, 1), device=dev)
        dx = torch.randint(0, 2 * padding + 1, (n, 1), device=dev)
        rows = (dy + torch.arange(h, device=dev))[:, None, :, None]
        cols = (dx + torch.arange(w, device=dev))[:, None, None, :]
        batch = torch.arange(n, device=dev)[:, None, None, None]
        chan = torch.arange(c, device=dev)[None, :, None, None]
        out = padded[batch, chan, rows, cols]
        flip = torch.rand(n, device=dev) < 0.5
        return torch.where(flip[:, None, None, None], out.flip(3), out)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        self.begin_epoch()
        idx = torch.tensor(list(self.sampler), dtype=torch.int64).to(self.images.device, non_blocking=True)
        stop = len(idx) - len(idx) % self.batch_size if self.drop_last else len(idx)
        for start in range(0, stop, self.batch_size):
            b = idx[start : start + self.batch_size]
            x = self.images[b]
            if self.augment:
                x = self.random_crop_flip(x)
            yield (x.float() - self.mean) / self.std, self.targets[b]
