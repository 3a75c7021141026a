"""Exact mid-epoch resume: training loaders that tell Lightning where in the epoch they were.

Lightning restores a mid-epoch checkpoint (e.g. SLURM's preemption checkpoint, see :mod:`project.cluster`)
by counting the batches already trained, but a plain ``DataLoader`` starts the epoch over, so the resumed
run trains on the epoch's first batches twice and never sees its last ones. Lightning's stateful-loader
protocol (``state_dict`` / ``load_state_dict`` on the training loader, saved in the checkpoint's
``loops.fit_loop.combined_loader``) closes that gap: the loader records how many batches of the current
epoch were trained, and after loading it the next epoch iterator skips exactly those samples, by index,
without loading them. The data module keeps the same count in its own state (Lightning restores a data
module before it builds the loaders, which matters when ``configure_optimizers`` has built the training
loader early, e.g. for ``trainer.estimated_stepping_batches``); both set the same skip, so either suffices.
With the per-epoch order from :class:`ResumableSampler` (seed + epoch), a resumed run then sees the same
batches as an uninterrupted one.

Which epoch's order: ``trainer.current_epoch``'s, read at the epoch's first batch (:meth:`ResumableState.begin_epoch`).
Two Lightning 2.6 behaviours would make a resumed run train on another epoch's order: the fit loop creates the
training iterator (``FitLoop.setup_data``) before it calls ``sampler.set_epoch`` for the epoch it resumes, and a
``DataLoader`` with worker processes draws its first indices the moment its iterator is created (epoch 0's order
after every resume with ``num_workers > 0``); and with ``trainer.max_steps`` set, the count Lightning passes to
``set_epoch`` runs one ahead of the epoch after a resume. :class:`ResumableLoader` therefore creates the
``DataLoader`` iterator at the first batch, for every ``num_workers``/``persistent_workers``.

Not restored: the global random state (only CIFAR-10's ``augment: true`` draws from it per batch).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from torch.utils.data import DataLoader, DistributedSampler


class ResumableSampler(DistributedSampler):
    """``DistributedSampler`` whose next pass can start part-way through its epoch.

    ``skip_next(n)`` drops the first ``n`` indices of the next ``__iter__`` only; ``__len__`` stays the full
    epoch's (Lightning adds the batches already trained to its own count).
    """

    _skip = 0

    def skip_next(self, n: int) -> None:
        self._skip = max(int(n), 0)

    def __iter__(self) -> Iterator[int]:
        indices = list(super().__iter__())
        skip, self._skip = self._skip, 0
        return iter(indices[skip:])


def batches_done(trainer: Any) -> int:
    """Training batches of the current, unfinished epoch already taken by the fit loop; 0 without a trainer or
    once the epoch's batches are all taken (a checkpoint at the epoch's end resumes with the next epoch)."""
    if trainer is None:
        return 0
    done = int(trainer.fit_loop.epoch_loop.batch_progress.current.ready)
    return done if done < trainer.num_training_batches else 0


class ResumableState:
    """Lightning's stateful-loader protocol for a training loader with a :class:`ResumableSampler`.

    The owner sets ``trainer`` (to read the fit loop's batch count) and provides ``sampler`` and
    ``batch_size``.
    """

    trainer: Any = None
    sampler: Any
    batch_size: Any

    def begin_epoch(self) -> None:
        """Before an epoch's first batch: give the sampler ``trainer.current_epoch`` (no-op without a trainer).

        Lightning's own ``set_epoch`` passes its count of processed epochs, which after a resume with
        ``trainer.max_steps`` set counts the checkpoint's epoch twice (one from an epoch's end, or from a run that
        ``max_steps`` stopped in the middle of an epoch); the epoch index does not.
        """
        # Lightning swaps in a plain SequentialSampler for overfit_batches: no epochs to set there
        if self.trainer is not None and hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(self.trainer.current_epoch)

    def state_dict(self) -> dict[str, int]:
        """``{"batches": n}``: batches of the current epoch trained when the checkpoint was written."""
        return {"batches": batches_done(self.trainer)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Make the next epoch iterator skip the ``batches`` already trained (``batches * batch_size`` samples)."""
        self.sampler.skip_next(int(state.get("batches", 0)) * int(self.batch_size))


class ResumableLoader(ResumableState, DataLoader):
    """A ``DataLoader`` (same arguments) over a :class:`ResumableSampler` that resumes mid-epoch exactly."""

    # a generator, not DataLoader's _BaseDataLoaderIter: Lightning and torch only iterate it
    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        """The ``DataLoader``'s own iterator, created at the first ``next()`` (after Lightning's ``set_epoch``)."""
        self.begin_epoch()
        yield from super().__iter__()
