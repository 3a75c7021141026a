"""Training-time callbacks: cudnn flags, throughput and epoch time, the learning rate at every step.

* Where is ``torch.backends.cudnn.enabled`` set?  :class:`CudnnFlags` (``benchmark`` and ``deterministic``
  are Lightning's own Trainer flags).
* Where are samples/s and epoch times measured?  :class:`Throughput` (Lightning's ``ThroughputMonitor``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, LearningRateMonitor, ThroughputMonitor
from lightning.pytorch.trainer.states import RunningStage
from lightning.pytorch.utilities import rank_zero_only

from project import adapters
from project.callbacks.fresh import FreshEachFit


class CudnnFlags(Callback):
    """Sets ``torch.backends.cudnn.enabled`` for the run (recipe A sets it explicitly); restores it after.

    ``None`` leaves the process-wide flag as it is. ``cudnn.benchmark`` and ``cudnn.deterministic`` are
    Lightning's ``trainer.benchmark`` / ``trainer.deterministic`` (Lightning leaves ``benchmark`` untouched
    when it is not set).
    """

    def __init__(self, enabled: bool | None = None) -> None:
        self.enabled = enabled
        self._previous: bool | None = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self.enabled is not None:
            self._previous = torch.backends.cudnn.enabled
            torch.backends.cudnn.enabled = self.enabled

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self._previous is not None:
            torch.backends.cudnn.enabled = self._previous
            self._previous = None

    @staticmethod
    def in_effect() -> dict[str, bool]:
        """The cudnn flags as they are now: ``cudnn_enabled``, ``cudnn_benchmark``, ``deterministic``."""
        return {
            "cudnn_enabled": bool(torch.backends.cudnn.enabled),
            "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
            "deterministic": bool(torch.are_deterministic_algorithms_enabled()),
        }


def synced_time(device: torch.device) -> float:
    """``time.perf_counter()`` (seconds) after the device finished its queued work (CUDA is asynchronous).

    The bench's clock; it reads time as Lightning's ``ThroughputMonitor`` (:class:`Throughput`) does.
    """
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def batch_samples(batch: Any) -> int:
    """N: the samples in an ``(images (N, C, H, W), labels (N,))`` batch or a prediction batch of images alone."""
    return len(batch) if isinstance(batch, torch.Tensor) else len(batch[0])


class Throughput(FreshEachFit, adapters.TrainingRatesOnly, ThroughputMonitor):
    """Lightning's ``ThroughputMonitor``, logging training only, plus the time and rate of each epoch.

    The clock and the counting are the library's: ``time.perf_counter()`` after ``torch.cuda.synchronize()`` on
    CUDA, validation time subtracted from training time, samples counted per batch. Logged every
    ``trainer.log_every_n_steps`` steps, as rates over the last ``window_size`` steps (default: the same
    ``log_every_n_steps``, so each point covers the steps since the previous one):
    ``train/device/samples_per_sec``, ``train/device/batches_per_sec`` and ``train/device/flops_per_sec`` (FLOPs
    from the module's ``flops_per_batch``), ``train/device/mfu`` on GPUs whose peak Lightning knows, the same
    without ``device/`` summed over ranks when there is more than one, and ``train/time`` (seconds),
    ``train/samples``, ``train/batches`` so far (continued across a resume: :meth:`state_dict`; Lightning's monitor
    starts them at 0 on every fit). Validation and test throughput are measured (the subtraction needs them) but
    not logged.

    Added here, each epoch: ``train/epoch_time_s`` (seconds of training steps, data loading included,
    validation and checkpointing excluded), logged, and ``epoch_time_s`` / ``samples_per_s`` lists (all ranks
    together) for ``results.json``; ``flags``: the cudnn flags in effect during training. Rank 0 only, like
    the library callback. Takes the parent's arguments (``batch_size_fn`` defaults to :func:`batch_samples`).

    Differences from Lightning's ThroughputMonitor, as Lightning's own tests show them (``scripts/upstream_tests.sh``;
    results in docs/reliability.md): validation, test and predict rates are not logged (5 tests); one more
    ``log_metrics`` call per epoch (``train/epoch_time_s``), and the epoch clock reads ``time.perf_counter``,
    whose values those tests script call by call (6 tests; they pass with the two epoch hooks removed);
    ``window_size`` defaults to ``log_every_n_steps`` (at least 2), not 100.
    """

    def __init__(
        self,
        window_size: int | None = None,
        batch_size_fn: Callable[[Any], int] = batch_samples,
        length_fn: Callable[[Any], int] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(batch_size_fn=batch_size_fn, length_fn=length_fn, **kwargs)
        self.window_size = window_size
        self.epoch_time_s: list[float] = []
        self.samples_per_s: list[float] = []
        self.flags: dict[str, bool] = {}
        self._epoch_start: tuple[float, int] = (0.0, 0)
        self._resumed: tuple[int, int, float] = (0, 0, 0.0)

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.fresh_for(trainer, stage)  # another Trainer's fit: its own epoch times, not the last fit's too
        # Trainer.log_every_n_steps: set by Lightning's LoggerConnector, not declared on the class
        self.kwargs["window_size"] = max(2, self.window_size or trainer.log_every_n_steps)  # type: ignore[attr-defined]
        super().setup(trainer, pl_module, stage)

    def state_dict(self) -> dict[str, Any]:
        """In every checkpoint: the training totals so far, ``{"samples": int, "batches": int, "seconds": float}``
        (rank 0's: samples per process), from which a resumed fit continues ``train/samples``, ``train/batches``
        and ``train/time``."""
        samples, batches, seconds = adapters.training_totals(self, RunningStage.TRAINING)
        resumed = self._resumed if not samples else (0, 0, 0.0)  # saved before any step of a resumed fit
        return {"samples": samples + resumed[0], "batches": batches + resumed[1], "seconds": seconds + resumed[2]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """A resumed fit's totals start where the checkpoint's ended (applied when training starts)."""
        values = (state_dict.get("samples", 0), state_dict.get("batches", 0), state_dict.get("seconds", 0.0))
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 for v in values):
            self._resumed = (int(values[0]), int(values[1]), float(values[2]))

    def on_train_start(self, trainer: L.Trainer, *args: Any) -> None:
        super().on_train_start(trainer, *args)
        samples, batches, seconds = self._resumed
        if not trainer.is_global_zero or not (samples or batches):
            return
        # A checkpoint written from another callback's on_train_batch_end (a preemption handler, a test's stop) is
        # saved before this monitor counts that batch: the restored step count says how many batches were trained.
        trained = trainer.global_step * trainer.accumulate_grad_batches
        if trained > batches:  # the batches it missed, at the run's mean samples and seconds per batch
            missed = (trained - batches) / max(batches, 1)
            samples, seconds, batches = samples + round(missed * samples), seconds * (1 + missed), trained
        adapters.continue_training_clock(self, RunningStage.TRAINING, samples, batches, seconds)

    @rank_zero_only
    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.flags = CudnnFlags.in_effect()
        t0, samples, _ = adapters.training_clock(self, RunningStage.TRAINING)
        self._epoch_start = (synced_time(pl_module.device) - t0, samples)

    @rank_zero_only
    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        _, samples, times = adapters.training_clock(self, RunningStage.TRAINING)
        samples -= self._epoch_start[1]
        if not samples or not times:
            return
        seconds = times[-1] - self._epoch_start[0]
        self.epoch_time_s.append(seconds)
        self.samples_per_s.append(samples * trainer.world_size / seconds)
        pl_module.log("train/epoch_time_s", seconds, on_epoch=True, rank_zero_only=True)


class StepLearningRateMonitor(LearningRateMonitor):
    """Lightning's ``LearningRateMonitor`` (``lr-<Optimizer>`` tags), logging once at every optimizer step (with
    ``trainer.accumulate_grad_batches``, at the first batch of each step's accumulation).

    The stock callback logs only every ``trainer.log_every_n_steps`` steps (none at all in a run shorter
    than that); one scalar per step costs nothing measurable next to a training step. Takes the parent's
    ``log_momentum`` and ``log_weight_decay``; ``logging_interval`` is always ``"step"``.

    Differences from Lightning's LearningRateMonitor, as Lightning's own tests show them
    (``scripts/upstream_tests.sh``; results in docs/reliability.md): no ``logging_interval`` argument (4 tests);
    an epoch-wise scheduler's rate is logged at every step, not once per epoch
    (``test_lr_monitor_update_callback_metrics``); names of param groups added at an epoch start
    (``BackboneFinetuning``) appear at that epoch's first step, not at its start
    (``test_multiple_optimizers_basefinetuning``).
    """

    def __init__(self, log_momentum: bool = False, log_weight_decay: bool = False) -> None:
        super().__init__(logging_interval="step", log_momentum=log_momentum, log_weight_decay=log_weight_decay)
        self.logged_step: int | None = None

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        self.logged_step = None  # a new fit (or a resume) with this callback object starts logging again

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any, **kwargs: Any) -> None:
        # once per optimizer step: with trainer.accumulate_grad_batches N, the N batches of one step share its rate
        step = adapters.optimizer_steps(trainer)
        if step == self.logged_step:
            return
        stats = adapters.lr_stats(self, trainer)
        if stats:
            self.logged_step = step
            for logger in trainer.loggers:
                logger.log_metrics(stats, step=step)
