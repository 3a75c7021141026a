"""A stop signal (SIGTERM: ``docker stop``, ``scancel``, a pod's deletion) at any moment of a fit: every process of the
run stops at the same point, in seconds, and none hangs.

Lightning 2.6 decides alone, in each process: its SIGTERM handler sets that process's ``received_sigterm`` and calls
a ``torch.distributed.broadcast`` from inside the handler, and its loops raise ``SIGTERMException`` wherever they next
check the flag. Under DDP the ranks get the signal at different moments (``docker stop`` signals the launching rank,
which forwards it), so one rank raises where the others go on into a collective, or the handler's broadcast meets
another one: both processes hang until the process-group timeout (4 of 4 early stops of a 2-process run). So here:

* **A signal only marks the process**. ``python -m project.fit`` marks from its start
  (:func:`watch`), before Lightning's handler exists; during each Trainer run the handler Lightning installs is
  replaced by the same marking plus Lightning's forwarding of the signal to the processes its launcher started
  (:meth:`StopOnSignal.setup`).
* **The processes agree at points every one of them reaches together** (:meth:`StopOnSignal.agree`: an all-reduce
  of the marks, MAX; nothing to agree in one process), and only then is Lightning's flag set, on every process at
  once, where Lightning's own check follows at once on all of them:

  - after each training step but an epoch's last (Lightning then raises after the step, which is complete, and
    after a validation that follows it, which runs to its end);
  - at the end of each training epoch, after its validation (Lightning raises before the next epoch);
  - at the start of the test (the fit is over: :class:`~lightning.pytorch.utilities.exceptions.SIGTERMException`
    is raised here on every process), and after each test batch that is not the last of any process (evaluation
    shards are not padded, so the processes may hold different numbers of batches: only the first ``min - 1`` are
    common points).

  A validation is never cut short: a run resumed from inside one skips it for good (Lightning moves its counters
  to the validation's end), so its checkpoint and ``val/acc`` point would be missing. A signal during validation
  is acted on at the next step or the epoch's end; one that comes during the test's last batch or later lets the
  run finish: the report takes seconds.

The raise then goes where a SIGTERM always went: :class:`project.cluster.SlurmRequeue` saves ``hpc_ckpt_<k>.ckpt``
under a job id (a collective every rank reaches), and ``fit`` ends with one ``error: stopped by SIGTERM`` line and
by SIGTERM itself (exit 143). The resumed run continues after the last complete step or epoch.
"""

from __future__ import annotations

import logging
import math
import signal
from types import FrameType
from typing import Any

import lightning as L
import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.exceptions import SIGTERMException

from project import adapters

log = logging.getLogger(__name__)

_pending = False


def _mark(signum: int, frame: FrameType | None) -> None:
    global _pending
    _pending = True


def watch() -> None:
    """Mark this process on SIGTERM instead of ending it, from now on (call it first thing in a fit's process, in
    the main thread). A process that inherited SIGTERM ignored keeps ignoring it."""
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_IGN:
        signal.signal(signal.SIGTERM, _mark)


def _reduced(trainer: L.Trainer, value: int, op: Any) -> int:
    """``value`` reduced by ``op`` over the run's processes (a collective under DDP); ``value`` in one process."""
    if trainer.world_size > 1 and dist.is_available() and dist.is_initialized():
        tensor = torch.tensor([value], device=trainer.strategy.root_device)
        dist.all_reduce(tensor, op=op)
        return int(tensor.item())
    return value


class StopOnSignal(Callback):
    """Makes the processes of a run agree on a SIGTERM before Lightning acts on it (see the module docstring for the
    protocol and why). Part of :class:`project.cluster.SlurmRequeue`, which every run has.

    Cost under DDP: one all-reduce of one integer (and a host sync) after each training step and each test batch;
    none in one process.
    """

    _common_batches = 0  # the test batches every process has
    _held = False  # an agreed stop held back while a validation runs

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        launcher = trainer.strategy.launcher

        def notifier(signum: int, frame: FrameType | None) -> None:
            log.info("rank %d: received signal %d; stopping where every process can", trainer.global_rank, signum)
            if not _pending and launcher is not None:
                launcher.kill(signum)  # as Lightning's handler: the processes it started get the signal too
            _mark(signum, frame)

        adapters.replace_sigterm_notifier(trainer, notifier)

    def agree(self, trainer: L.Trainer) -> bool:
        """Whether any process of the run has received SIGTERM (a collective under DDP: every process calls it at
        the same point); if so Lightning's ``received_sigterm`` is set here, on every process."""
        stop = bool(_reduced(trainer, int(_pending), dist.ReduceOp.MAX))
        if stop:
            adapters.set_received_sigterm(trainer)
        return stop

    # -- training ------------------------------------------------------------------------------------------------
    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        if not adapters.training_done(trainer):
            self.agree(trainer)  # Lightning raises after this step (training_epoch_loop.on_advance_end)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.agree(trainer)  # Lightning raises when the epoch ends (fit_loop.on_advance_end)

    # -- evaluation ----------------------------------------------------------------------------------------------
    def _count(self, trainer: L.Trainer, counts: list[int | float]) -> None:
        mine = min(counts, default=0)
        local = int(mine) if math.isfinite(mine) else 0  # a loader without a length: no common points
        self._common_batches = _reduced(trainer, local, dist.ReduceOp.MIN)

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # A validation that follows a step where the processes agreed (val_check_interval) runs to its end: Lightning
        # would stop it at its first batch, and a run resumed from there skips that validation for good.
        self._held = trainer.received_sigterm
        if self._held:
            adapters.set_received_sigterm(trainer, False)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._held:
            adapters.set_received_sigterm(trainer)  # Lightning raises after the step that preceded the validation
            self._held = False

    def on_test_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.agree(trainer):
            raise SIGTERMException  # the fit is over; its checkpoints stand

    def on_test_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._count(trainer, trainer.num_test_batches)

    def on_test_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        batch_idx = args[2]  # (outputs, batch, batch_idx[, dataloader_idx]), as Lightning passes them
        if batch_idx < self._common_batches - 1:
            self.agree(trainer)  # Lightning raises after this batch (evaluation_loop._evaluation_step)
