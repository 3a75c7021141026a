"""Callbacks and plugins: pruning, cudnn flags, throughput, atomic checkpoints, sparsity counting.

* Where is ``torch.backends.cudnn.enabled`` set?  :class:`CudnnFlags` (``benchmark`` and ``deterministic``
  are Lightning's own Trainer flags).
* Where are pruned weights counted?  :func:`sparsity` -- from the weights themselves, never from a
  callback's bookkeeping.
"""

from __future__ import annotations

import glob
import inspect
import itertools
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import fsspec
import lightning as L
import torch
from fsspec.implementations.local import LocalFileSystem
from jsonargparse.typing import NonNegativeInt, PositiveInt, restricted_number_type
from lightning.pytorch.callbacks import Callback, LearningRateMonitor, ModelCheckpoint, ModelPruning, ThroughputMonitor
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.trainer.states import RunningStage, TrainerFn
from lightning.pytorch.utilities import rank_zero_only, rank_zero_warn
from torch import nn
from torch.nn.utils import prune

from project import adapters, runs
from project.errors import ConfigError, require

log = logging.getLogger(__name__)

LAYER_TYPES: dict[str, type[nn.Module]] = {"Conv2d": nn.Conv2d, "Linear": nn.Linear}
PruningAmount = restricted_number_type("PruningAmount", float, [(">=", 0), ("<", 1)], join="and")


def sparsity(pairs: list[tuple[str, torch.Tensor]]) -> dict[str, float]:
    """Fraction of exact zeros, per named tensor and over all of them (key ``"global"``).

    Args:
        pairs: ``(name, tensor)``; each tensor counted once even if listed twice.

    Returns:
        ``{name: zeros / numel, ..., "global": total zeros / total numel}``, fractions in [0, 1].
    """
    out: dict[str, float] = {}
    zeros = total = 0
    seen: set[int] = set()
    for name, t in pairs:
        z, n = int((t == 0).sum()), t.numel()
        out[name] = z / n if n else 0.0
        if id(t) not in seen:
            seen.add(id(t))
            zeros, total = zeros + z, total + n
    out["global"] = zeros / total if total else 0.0
    return out


def nonzero_params(module: nn.Module) -> int:
    """Number of non-zero parameter elements; a pruned tensor counts through its effective ``orig * mask``."""
    count = 0
    for sub in module.modules():
        for name, p in sub.named_parameters(recurse=False):
            base = name.removesuffix("_orig")
            mask = getattr(sub, f"{base}_mask", None) if name.endswith("_orig") else None
            count += int(((p * mask) if mask is not None else p).count_nonzero())
    return count


class Pruning(ModelPruning):
    """Magnitude (or random) pruning on a schedule, resumable; a subclass of Lightning's ``ModelPruning``.

    The masks come from ``torch.nn.utils.prune`` through ``ModelPruning``. What this class adds:

    * a schedule from scalars: pruning happens at the **start** of each epoch from ``start_epoch`` to
      ``end_epoch`` (default: ``start_epoch`` only), the total pruned fraction growing linearly to
      ``amount`` at ``end_epoch``. Pruning at the start of an epoch means that epoch's validation and
      checkpoint already see the pruned weights;
    * resumable masks: Lightning's ``ModelPruning`` keeps no state, so a resumed run used to lose its
      masks and the zeros filled back in. The masks are saved in the checkpoint's callback state and
      re-applied when fit resumes, before the optimizer state is restored;
    * ``sparsity/global`` and ``sparsity/<layer>`` logged each epoch, counted from the weights;
    * only real ``nn.Parameter`` attributes of the chosen layer types are pruned (a ``weight`` that
      is a bool, a buffer or ``None`` is skipped).

    Every checkpoint (``ModelCheckpoint``'s, ``trainer.save_checkpoint``'s, at any point of the schedule, with
    or without ``make_pruning_permanent``) holds the plain, mask-applied weights under the net's own parameter
    names, so it loads with ``ImageClassifier.load_from_checkpoint`` and strictly into an unpruned net; the
    masks and the schedule travel in the callback's state. Several ``Pruning`` callbacks can run in one Trainer,
    with different or identical settings (like Lightning's ``ModelPruning``): each has its own ``state_key``, the
    settings plus, from the second callback with the same settings on, its place among them (``copy``), so a
    resumed run gives each callback its own state back.

    Args:
        method: ``"l1_unstructured"`` (recipe default), ``"random_unstructured"`` or ``"ln_structured"``.
        amount: final fraction of the selected weights set to zero, in [0, 1).
        start_epoch: first epoch (0-based) at whose start pruning is applied.
        end_epoch: last pruning epoch; ``None`` prunes once at ``start_epoch``.
        global_pruning: rank all selected tensors together (unstructured methods only) instead of per layer.
        layers: module class names whose parameters are pruned.
        parameter_names: which parameters of those layers (``weight``, ``bias``).
        n: norm order for ``ln_structured``.
        dim: dimension along which ``ln_structured`` removes slices (0 = output channels).
        make_pruning_permanent: remove the masks at the end of fit, leaving zeros in plain weights.
        lottery_ticket: reset the unpruned weights to their initial values after each pruning step
            (Frankle & Carbin 2019); off, as in the recipe.
        verbose: Lightning's ``ModelPruning`` verbosity (0, 1 or 2).

    Raises:
        ConfigError: ``amount`` outside [0, 1), ``end_epoch < start_epoch``, unknown layer type, or global
            pruning with a structured method.
    """

    def __init__(
        self,
        method: Literal["l1_unstructured", "random_unstructured", "ln_structured"] = "l1_unstructured",
        amount: PruningAmount = 0.5,
        start_epoch: NonNegativeInt = 0,
        end_epoch: NonNegativeInt | None = None,
        global_pruning: bool = True,
        layers: list[Literal["Conv2d", "Linear"]] | None = None,
        parameter_names: list[Literal["weight", "bias"]] | None = None,
        n: PositiveInt = 1,
        dim: NonNegativeInt = 0,
        make_pruning_permanent: bool = True,
        lottery_ticket: bool = False,
        verbose: Literal[0, 1, 2] = 0,
    ) -> None:
        require(0 <= amount < 1, "pruning amount", f"must be in [0, 1), got {amount}")
        end_epoch = start_epoch if end_epoch is None else end_epoch
        require(end_epoch >= start_epoch, "pruning end_epoch", f"({end_epoch}) must be >= start_epoch ({start_epoch})")
        layers = layers or ["Conv2d", "Linear"]
        structured = method == "ln_structured"
        require(
            not (structured and global_pruning),
            "pruning global_pruning",
            "ln_structured prunes per layer; set global_pruning: false",
        )
        super().__init__(
            pruning_fn=method,
            parameter_names=parameter_names or ["weight"],
            use_global_unstructured=global_pruning,
            amount=self._step_amount,
            make_pruning_permanent=make_pruning_permanent,
            use_lottery_ticket_hypothesis=lottery_ticket,
            pruning_dim=dim if structured else None,
            pruning_norm=n if structured else None,
            verbose=verbose,
        )
        self.method, self.target, self.start_epoch, self.end_epoch = method, amount, start_epoch, end_epoch
        self.layer_types = tuple(LAYER_TYPES[name] for name in layers)
        self._names: dict[int, str] = {}
        self._pending_masks: dict[str, torch.Tensor] | None = None
        self._pruned = False
        # Which copy of these settings this is: provisional (in order of creation) until numbered among a
        # Trainer's callbacks (number_copies), then the order in which that Trainer lists them.
        self.copy = next(Pruning._created.setdefault(repr(self.schedule()), itertools.count()))

    _created: dict[str, itertools.count] = {}

    @property
    def state_key(self) -> str:
        copy = {"copy": self.copy} if self.copy else {}
        return adapters.state_key(self, **self.schedule(), **copy)

    @staticmethod
    def number_copies(callbacks: list[Callback]) -> None:
        """Number the ``Pruning`` callbacks of one Trainer that have identical settings, in list order (0, 1, ...).

        Called at ``setup`` and by the CLI once its Trainer is built; the numbers are what tie each callback to
        its state in a checkpoint, so a run resumed with the same callbacks in the same order gets each its own.
        """
        seen: dict[str, int] = {}
        for cb in callbacks:
            if isinstance(cb, Pruning):
                key = repr(cb.schedule())
                cb.copy = seen.get(key, 0)
                seen[key] = cb.copy + 1

    def schedule(self) -> dict[str, Any]:
        """The settings that decide which weights are pruned when (stored in checkpoints, compared on resume)."""
        names, global_pruning = adapters.pruning_settings(self)
        return {
            "method": self.method,
            "amount": float(self.target),
            "start_epoch": int(self.start_epoch),
            "end_epoch": int(self.end_epoch),
            "layers": [t.__name__ for t in self.layer_types],
            "parameter_names": names,
            "global_pruning": global_pruning,
        }

    # -- schedule ------------------------------------------------------------------------------
    def target_at(self, epoch: int) -> float:
        """Total pruned fraction the schedule asks for once ``epoch`` has started."""
        if epoch < self.start_epoch:
            return 0.0
        steps = self.end_epoch - self.start_epoch + 1
        return self.target * min(epoch - self.start_epoch + 1, steps) / steps

    def _step_amount(self, epoch: int) -> float:
        # torch.nn.utils.prune applies a float amount to the weights still unpruned, hence the ratio.
        if not self.start_epoch <= epoch <= self.end_epoch:
            return 0.0
        before, after = self.target_at(epoch - 1), self.target_at(epoch)
        return (after - before) / (1 - before)

    # -- which tensors -------------------------------------------------------------------------
    def filter_parameters_to_prune(self, parameters_to_prune: Any = ()) -> list[tuple[nn.Module, str]]:
        return [
            (m, name)
            for m, name in parameters_to_prune
            if isinstance(m, self.layer_types) and isinstance(getattr(m, name, None), nn.Parameter)
        ]

    def named_targets(self) -> list[tuple[str, torch.Tensor]]:
        """``(layer.param, effective tensor)`` for each pruned tensor (``orig * mask`` while masks are on)."""
        pairs = adapters.pruning_targets(self)
        return [(f"{self._names[id(m)]}.{name}", getattr(m, name).detach()) for m, name in pairs]

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        Pruning.number_copies(trainer.callbacks)
        if stage != "fit":
            return
        super().setup(trainer, pl_module, stage)
        self._names = {id(m): name for name, m in pl_module.named_modules()}
        last = (trainer.max_epochs or 0) - 1
        if trainer.max_epochs not in (None, -1) and last < self.end_epoch:
            reached = self.target_at(last)
            rank_zero_warn(
                f"pruning schedule runs to epoch {self.end_epoch} but max_epochs is {trainer.max_epochs}: "
                f"sparsity will reach {reached:.2f}, not {self.target:.2f}. Lower start_epoch/end_epoch "
                "or raise trainer.max_epochs",
                category=UserWarning,
            )

    def apply_pruning(self, amount: float) -> None:
        # torch's global_unstructured flattens weights and masks with .view(-1), which fails on channels_last
        # tensors: prune on contiguous copies, then give the parameters back their memory format.
        restore = []
        for m, name in adapters.pruning_targets(self):
            for attr in (f"{name}_orig", name, f"{name}_mask"):
                t = getattr(m, attr, None)
                if isinstance(t, torch.Tensor) and not t.is_contiguous():
                    if isinstance(t, nn.Parameter):
                        t.data = t.data.contiguous()
                        restore.append(t)
                    else:
                        setattr(m, attr, t.contiguous())
        super().apply_pruning(amount)
        self._pruned = self._pruned or bool(amount)
        for p in restore:
            p.data = p.data.contiguous(memory_format=torch.channels_last)

    # -- hooks ---------------------------------------------------------------------------------
    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        adapters.run_pruning(self, trainer.current_epoch)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Lightning prunes here; we prune at the start of the epoch instead, and only report.
        stats = sparsity(self.named_targets())
        pl_module.log_dict({f"sparsity/{k}": v for k, v in stats.items()}, on_epoch=True)

    def state_dict(self) -> dict[str, Any]:
        masks = {}
        for m, name in adapters.pruning_targets(self):
            if hasattr(m, f"{name}_mask"):
                masks[f"{self._names[id(m)]}.{name}"] = getattr(m, f"{name}_mask").detach().cpu()
            elif self._pruned:  # made permanent at the end of fit: the mask is where the zeros are
                masks[f"{self._names[id(m)]}.{name}"] = (getattr(m, name) != 0).detach().cpu().to(torch.float32)
        return {"masks": masks, "schedule": self.schedule()}

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        # Replaces ModelPruning's, which only does this with make_pruning_permanent: store ``orig * mask`` under
        # the plain name, so the state_dict is the unpruned net's whatever the options.
        sd = checkpoint["state_dict"]
        prefix = {id(m): name for name, m in pl_module.named_modules()}
        for m, name in adapters.pruning_targets(self):
            key = f"{prefix[id(m)]}.{name}" if prefix[id(m)] else name
            if f"{key}_orig" in sd and f"{key}_mask" in sd:
                sd[key] = sd.pop(f"{key}_orig") * sd.pop(f"{key}_mask")

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._pending_masks = state_dict.get("masks") or None

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Runs after the optimizer was built over the plain parameters and before its state is restored,
        # exactly as in an uninterrupted run, where pruning renames ``weight`` to ``weight_orig`` in place.
        if not self._pending_masks:
            return
        targets = {f"{self._names[id(m)]}.{name}": (m, name) for m, name in adapters.pruning_targets(self)}
        for key, mask in self._pending_masks.items():
            module, name = targets[key]
            prune.custom_from_mask(module, name, mask.to(getattr(module, name).device))
            self._pruned = True
        log.info("restored %d pruning masks from the checkpoint", len(self._pending_masks))
        self._pending_masks = None


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


class Throughput(adapters.TrainingRatesOnly, ThroughputMonitor):
    """Lightning's ``ThroughputMonitor``, logging training only, plus the time and rate of each epoch.

    The clock and the counting are the library's: ``time.perf_counter()`` after ``torch.cuda.synchronize()`` on
    CUDA, validation time subtracted from training time, samples counted per batch. Logged every
    ``trainer.log_every_n_steps`` steps, as rates over the last ``window_size`` steps (default: the same
    ``log_every_n_steps``, so each point covers the steps since the previous one):
    ``train/device/samples_per_sec``, ``train/device/batches_per_sec`` and ``train/device/flops_per_sec`` (FLOPs
    from the module's ``flops_per_batch``), ``train/device/mfu`` on GPUs whose peak Lightning knows, the same
    without ``device/`` summed over ranks when there is more than one, and ``train/time`` (seconds),
    ``train/samples``, ``train/batches`` so far. Validation and test throughput are measured (the subtraction
    needs them) but not logged.

    Added here, each epoch: ``train/epoch_time_s`` (seconds of training steps, data loading included,
    validation and checkpointing excluded), logged, and ``epoch_time_s`` / ``samples_per_s`` lists (all ranks
    together) for ``results.json``; ``flags``: the cudnn flags in effect during training. Rank 0 only, like
    the library callback. Takes the parent's arguments (``batch_size_fn`` defaults to :func:`batch_samples`).

    Differences from Lightning's ThroughputMonitor, by Lightning's own tests (``scripts/upstream_tests.sh``,
    11 of 13 fail, all for these): validation, test and predict rates are not logged (5 tests); one more
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

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.kwargs["window_size"] = max(2, self.window_size or trainer.log_every_n_steps)
        super().setup(trainer, pl_module, stage)


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


class LocalAtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's ``TorchCheckpointIO``; on a local path, written atomically and never through a link, and
    removed only as a single regular file.

    Lightning writes through an fsspec transaction, whose local temporary file lives in the system temp
    folder: when that is another filesystem (a container's ``/tmp`` vs a mounted ``logs/`` volume) the final
    move is a copy, and a run killed during it leaves a truncated checkpoint. Here the checkpoint goes to a new
    temporary file created exclusively in the same folder, then is renamed into place (see
    :func:`project.runs.write_bytes`). Lightning removes an old checkpoint with ``fs.rm(recursive=True)``: here
    only a regular file or a link itself is unlinked; a folder is never removed. URLs (``s3://``,
    ``memory://``, ...) go through Lightning's own path unchanged; ``file://`` URLs are local paths.
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        local = local_path(path)
        if local is None:
            return super().save_checkpoint(checkpoint, path, storage_options)
        local.parent.mkdir(parents=True, exist_ok=True)
        for stale in local.parent.glob(f".{glob.escape(local.name)}.*.tmp"):  # a writer killed midway (kill -9)
            if stale.is_file() and not stale.is_symlink():
                stale.unlink(missing_ok=True)
        with runs.atomic_file(local) as f:
            torch.save(checkpoint, f)

    def remove_checkpoint(self, path: Any) -> None:
        local = local_path(path)
        if local is None:
            return super().remove_checkpoint(path)
        if local.is_symlink() or local.is_file():
            local.unlink()
        elif local.exists():
            log.warning("not removing %s: a checkpoint is a file, this is not", local)


def local_path(path: Any) -> Path | None:
    """The local file a checkpoint path or fsspec URL names (``file://``, ``local://`` included), or ``None``
    for a remote one (``s3://``, ``memory://``, ...): fsspec's own URL parsing."""
    fs, stripped = fsspec.core.url_to_fs(str(path))
    return Path(stripped) if isinstance(fs, LocalFileSystem) else None


class StepLearningRateMonitor(LearningRateMonitor):
    """Lightning's ``LearningRateMonitor`` (``lr-<Optimizer>`` tags), logging at every optimizer step.

    The stock callback logs only every ``trainer.log_every_n_steps`` steps (none at all in a run shorter
    than that); one scalar per step costs nothing measurable next to a training step. Takes the parent's
    ``log_momentum`` and ``log_weight_decay``; ``logging_interval`` is always ``"step"``.

    Differences from Lightning's LearningRateMonitor, by Lightning's own tests (``scripts/upstream_tests.sh``,
    6 of 19 fail, all for these): no ``logging_interval`` argument (4 tests); an epoch-wise scheduler's rate is
    logged at every step, not once per epoch (``test_lr_monitor_update_callback_metrics``); names of param
    groups added at an epoch start (``BackboneFinetuning``) appear at that epoch's first step, not at its
    start (``test_multiple_optimizers_basefinetuning``).
    """

    def __init__(self, log_momentum: bool = False, log_weight_decay: bool = False) -> None:
        super().__init__(logging_interval="step", log_momentum=log_momentum, log_weight_decay=log_weight_decay)

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any, **kwargs: Any) -> None:
        stats = adapters.lr_stats(self, trainer)
        if stats:
            for logger in trainer.loggers:
                logger.log_metrics(stats, step=adapters.optimizer_steps(trainer))


class RunCheckpoint(ModelCheckpoint):
    """Lightning's ``ModelCheckpoint`` whose ``last.ckpt`` is the newest state at every save point.

    Lightning 2.6 rewrites ``last.ckpt`` at the end of validation only when a top-k checkpoint was saved in
    the same step: after an epoch that did not improve the monitored score, ``last.ckpt`` still held an older
    epoch, and a resume from it silently repeated epochs. Same arguments as the parent (and its signature).

    Differences from Lightning's ModelCheckpoint, by Lightning's own tests (``scripts/upstream_tests.sh``,
    18 of 137 fail, all for these): the callback's checkpoint state is stored under ``"RunCheckpoint{...}"``
    (Lightning keys it by class name; 12 tests look up ``"ModelCheckpoint{...}"`` and pass under that key);
    ``save_last='link'`` is refused (2); a restored ``best_model_path`` etc. outside ``dirpath`` is dropped
    (``test_model_checkpoint_saveload_ckpt``); ``last.ckpt`` is rewritten at every save point, so with
    ``save_last=True`` and no top-k save it is written every epoch (2 of
    ``test_save_last_every_n_epochs_interaction``). ``test_configure_model_checkpoint`` fails as the
    Trainer's own default callback is Lightning's class.
    """

    _last_saved_step: int | None = None

    def __init__(self, dirpath: str | Path | None = None, **kwargs: Any) -> None:
        if dirpath is not None and "://" in str(dirpath) and local_path(dirpath) is not None:
            # Lightning realpath()s a local dirpath as text: file:///x became ./file:/x in the working directory
            dirpath = str(local_path(dirpath))
        super().__init__(dirpath=dirpath, **kwargs)
        if self.save_last == "link":
            raise ConfigError(
                "checkpoint.save_last: 'link' makes last.ckpt a link to another checkpoint, which may be an older "
                "epoch than the last one; use true (last.ckpt then always holds the newest state)"
            )

    # the parent's keyword arguments, as inspect.signature (help(), IDEs, Lightning's own tests) reads them
    __init__.__signature__ = inspect.signature(ModelCheckpoint.__init__)  # type: ignore[attr-defined]

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Lightning's restore, with every path from the checkpoint treated as data: one that is not a file
        directly inside this callback's ``dirpath`` (``..``, links, other folders) is dropped, so it can never
        be chosen for removal or overwriting. A crafted checkpoint then costs at most a forgotten best score."""
        state = dict(state_dict)
        for key in ("best_model_path", "kth_best_model_path", "last_model_path"):
            if key in state and not runs.inside(self.dirpath, state[key]):
                state[key] = ""
        models = state.get("best_k_models")
        if isinstance(models, dict):
            state["best_k_models"] = {k: v for k, v in models.items() if runs.inside(self.dirpath, k)}
        elif "best_k_models" in state:
            state["best_k_models"] = {}
        if not state.get("best_model_path"):
            state["best_model_score"] = None
        if not state.get("last_model_path") and self.last_model_path:
            # trainer.test(ckpt_path="best") restores the best checkpoint's state, saved before that step's
            # last.ckpt: it would forget last.ckpt (results.json's last_ckpt and checkpoint_bytes were null)
            state["last_model_path"] = self.last_model_path
        super().load_state_dict(state)

    def _save_last_checkpoint(self, trainer: L.Trainer, monitor_candidates: dict[str, torch.Tensor]) -> None:
        super()._save_last_checkpoint(trainer, monitor_candidates)
        self._last_saved_step = trainer.global_step

    def _refresh_last(self, trainer: L.Trainer) -> None:
        if not self.save_last or trainer.sanity_checking or trainer.fast_dev_run:
            return
        if trainer.state.fn == TrainerFn.FITTING and self._last_saved_step != trainer.global_step:
            adapters.save_last_checkpoint(self, trainer)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.fast_dev_run:  # Lightning 2.6 saves last.ckpt here even under fast_dev_run, which saves nothing
            return
        super().on_train_end(trainer, pl_module)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_validation_end(trainer, pl_module)
        if not adapters.saves_on_train_epoch_end(self, trainer):
            self._refresh_last(trainer)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_epoch_end(trainer, pl_module)
        if adapters.saves_on_train_epoch_end(self, trainer):
            self._refresh_last(trainer)
