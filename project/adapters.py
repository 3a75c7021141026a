"""The one place that reaches into libraries' non-public members, where their public API lacks a hook.

Every function names what it reads or sets, in which library, and why no public way exists;
``tests/test_adapters.py`` checks each member still exists with the shape used here, so a library upgrade that
moves one fails that test instead of the product failing silently. Nothing else in ``project/`` may use a
library's underscored member (the same test greps for them).

Pinned to the tested series in ``pyproject.toml`` (Lightning 2.6, jsonargparse 4.53, Optuna 5.0, torch 2.14).
"""

from __future__ import annotations

import contextlib
import typing
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import LightningCLI

# -- Lightning: ModelCheckpoint ---------------------------------------------------------------------------------


class LastSaveRecorder(ModelCheckpoint):
    """Lightning's ``ModelCheckpoint`` that records in :attr:`last_saved_step` the global step of its newest
    ``last.ckpt``, by overriding ``ModelCheckpoint._save_last_checkpoint`` (the one method that writes it; no
    public hook tells when ``last.ckpt`` was written). ``project.callbacks.RunCheckpoint`` reads it."""

    last_saved_step: int | None = None

    def _save_last_checkpoint(self, trainer: Any, monitor_candidates: dict[str, torch.Tensor]) -> None:
        super()._save_last_checkpoint(trainer, monitor_candidates)
        self.last_saved_step = trainer.global_step


# -- Lightning: LightningCLI ------------------------------------------------------------------------------------


class TrainerCallbacksCLI(LightningCLI):
    """Lightning's ``LightningCLI`` whose Trainer callbacks pass through :meth:`trainer_callbacks` first, by
    overriding ``LightningCLI._instantiate_trainer(config, callbacks)``: the one place the config's callbacks and
    the class-argument callbacks (``--checkpoint``, ``--lr_monitor``, ...) meet before the Trainer is built; its
    public ``instantiate_trainer`` sees them only after."""

    def trainer_callbacks(self, config: dict[str, Any], callbacks: list[Any]) -> list[Any]:
        """The callbacks the Trainer gets; ``config`` is the Trainer's init arguments. Default: all of them."""
        return callbacks

    def _instantiate_trainer(self, config: dict[str, Any], callbacks: list[Any]) -> Any:
        return super()._instantiate_trainer(config, self.trainer_callbacks(config, callbacks))


def save_last_checkpoint(callback: Any, trainer: Any) -> None:
    """``ModelCheckpoint._save_last_checkpoint(trainer, _monitor_candidates(trainer))``: write ``last.ckpt`` now.

    Lightning 2.6 rewrites ``last.ckpt`` at the end of validation only together with a new top-k checkpoint;
    there is no public call to save "last" alone."""
    callback._save_last_checkpoint(trainer, callback._monitor_candidates(trainer))


def saves_on_train_epoch_end(callback: Any, trainer: Any) -> bool:
    """``ModelCheckpoint._should_save_on_train_epoch_end``: whether the callback saves at the end of the training
    epoch (no validation this epoch) rather than after validation."""
    return bool(callback._should_save_on_train_epoch_end(trainer))


def state_key(callback: Any, **settings: Any) -> str:
    """``Callback._generate_state_key(**settings)``: Lightning's documented way to key a stateful callback's
    checkpoint state by its settings (underscored, though the Callback docs show it)."""
    return callback._generate_state_key(**settings)


# -- Lightning: ModelPruning ------------------------------------------------------------------------------------


def pruning_targets(callback: Any) -> list[tuple[torch.nn.Module, str]]:
    """``ModelPruning._parameters_to_prune``: the (module, parameter name) pairs the callback prunes, known only
    after its ``setup``."""
    return list(callback._parameters_to_prune)


def pruning_settings(callback: Any) -> tuple[list[str], bool]:
    """``ModelPruning._parameter_names`` and ``_use_global_unstructured``: settings the constructor takes but
    exposes only privately."""
    return list(callback._parameter_names), bool(callback._use_global_unstructured)


class LotteryTicketFromInitialValues:
    """Mixin for a ``ModelPruning`` subclass: overrides ``ModelPruning._copy_param``, the private step of
    ``apply_lottery_ticket_hypothesis`` that resets a kept weight to its initial value. Lightning's copies with
    ``dst.data = src.data.to(device)``: on the same device that is the stored initial tensor itself, so training
    then updates the stored theta_0 in place and every later reset restores trained values (0.06 away at the second
    step of a schedule). This one copies a clone; there is no public hook for the copy."""

    @staticmethod
    def _copy_param(new: torch.nn.Module, old: torch.nn.Module, name: str) -> None:
        dst = getattr(new, f"{name}_orig", None)
        dst = dst if dst is not None else getattr(new, name, None)
        src = getattr(old, name, None)
        if isinstance(dst, torch.Tensor) and isinstance(src, torch.Tensor):
            dst.data = src.data.detach().clone().to(dst.device)


def run_pruning(callback: Any, epoch: int) -> None:
    """``ModelPruning._run_pruning(epoch)``: prune for this epoch by the callback's ``amount`` schedule (Lightning
    calls it at the end of an epoch; we call it at the start)."""
    callback._run_pruning(epoch)


# -- Lightning: TensorBoardLogger ------------------------------------------------------------------------------


def writer_kwargs(logger: Any) -> dict[str, Any]:
    """``TensorBoardLogger._kwargs``: the ``SummaryWriter`` arguments the logger was given beyond its own (Lightning
    passes them to the writer it creates in ``experiment``; a logger that creates the writer itself passes them
    too)."""
    return dict(logger._kwargs)


# -- Lightning: ThroughputMonitor -------------------------------------------------------------------------------


def training_clock(monitor: Any, stage: Any) -> tuple[float, int, list[float]]:
    """``ThroughputMonitor._t0s[stage]``, ``_samples[stage]`` and ``_throughputs[stage]._time``: the stage's start
    time, samples so far and the elapsed times recorded, from which per-epoch time and rate are derived (the
    monitor exposes only the rolling-window rates)."""
    return monitor._t0s[stage], monitor._samples[stage], list(monitor._throughputs[stage]._time)


def continue_training_clock(monitor: Any, stage: Any, samples: int, batches: int, seconds: float) -> None:
    """Start ``ThroughputMonitor``'s totals for ``stage`` at a resumed run's: ``_samples`` and ``_batches`` from
    ``samples``/``batches``, and ``_t0s`` ``seconds`` earlier, so ``train/samples``, ``train/batches`` and
    ``train/time`` continue instead of starting again at 0 (the monitor resets them at every fit's start and has no
    state of its own in a checkpoint)."""
    monitor._samples[stage] += samples
    monitor._batches[stage] += batches
    monitor._t0s[stage] -= seconds


def training_totals(monitor: Any, stage: Any) -> tuple[int, int, float]:
    """``ThroughputMonitor``'s totals so far for ``stage``: samples, batches, and seconds at the last update (0 when
    the stage has not started)."""
    if stage not in monitor._samples:
        return 0, 0, 0.0
    times = monitor._throughputs[stage]._time
    return monitor._samples[stage], monitor._batches[stage], float(times[-1]) if times else 0.0


class TrainingRatesOnly:
    """Mixin for a ``ThroughputMonitor`` subclass: its ``_compute`` (the private step that logs the rates) runs for
    the training stage only. Validation and test are still measured (``_update``: Lightning subtracts their time
    from the training clock), but their rates would land on the training x-axis; there is no public switch."""

    def _compute(self, trainer: Any, iter_num: int | None = None) -> None:
        from lightning.pytorch.trainer.states import RunningStage

        if trainer.state.stage == RunningStage.TRAINING:
            super()._compute(trainer, iter_num)  # type: ignore[misc]


# -- Lightning: LearningRateMonitor and the fit loop ------------------------------------------------------------


def lr_stats(monitor: Any, trainer: Any) -> dict[str, float]:
    """``LearningRateMonitor._extract_stats(trainer, "any")``: the ``lr-<Optimizer>`` values with Lightning's
    names (param groups, momentum), to log them at every step rather than every ``log_every_n_steps``."""
    return monitor._extract_stats(trainer, "any")


def optimizer_steps(trainer: Any) -> int:
    """``trainer.fit_loop.epoch_loop._batches_that_stepped``: the x-axis Lightning's own loggers use for
    step-wise metrics (``global_step`` counts optimizer steps per optimizer)."""
    return int(trainer.fit_loop.epoch_loop._batches_that_stepped)


def set_default_root_dir(trainer: Any, folder: str) -> None:
    """``Trainer._default_root_dir``: where Lightning's SLURM SIGUSR1 handler writes ``hpc_ckpt_<k>.ckpt``; the
    Trainer takes it only at construction, before the run folder is known."""
    trainer._default_root_dir = folder


def replace_sigterm_notifier(trainer: Any, notifier: Any) -> None:
    """``Trainer._signal_connector._sigterm_notifier_fn``: the SIGTERM handler Lightning installs at the start of
    each run (``_SignalConnector.register_signal_handlers`` reads it from the instance, after the ``setup`` hook).
    Lightning 2.6's own sets ``received_sigterm`` on the process that got the signal and calls
    ``torch.distributed.broadcast`` inside the handler: under DDP one rank then raises ``SIGTERMException`` where the
    others do not, or the handler's broadcast meets another collective, and every process hangs. No public setting
    replaces it."""
    trainer._signal_connector._sigterm_notifier_fn = notifier


def training_done(trainer: Any) -> bool:
    """``trainer.fit_loop.epoch_loop._is_training_done``: whether the step just run ends the epoch's training (its
    last batch, or ``max_steps``); Lightning's loop acts on ``received_sigterm`` after a step only when it does not."""
    return bool(trainer.fit_loop.epoch_loop._is_training_done)


def set_received_sigterm(trainer: Any, value: bool = True) -> None:
    """``Trainer._signal_connector.received_sigterm = value``: the flag Lightning's loops check between steps and
    batches to raise ``SIGTERMException`` (``Trainer.received_sigterm`` is its read-only view)."""
    trainer._signal_connector.received_sigterm = value


# -- jsonargparse -----------------------------------------------------------------------------------------------


def prefer_int_over_float(parser: Any) -> None:
    """Make ``Union[float, int]`` options parse ``1`` as the int 1 (``parser._actions``, ``action._typehint``).

    Lightning types e.g. ``limit_train_batches`` as ``float | int | None``: jsonargparse tries the types in
    order, so ``--trainer.limit_train_batches 1`` became 1.0 (100 %) instead of one batch."""
    for action in parser._actions:
        hint = getattr(action, "_typehint", None)
        if typing.get_origin(hint) is typing.Union:
            args = typing.get_args(hint)
            if float in args and int in args and args.index(float) < args.index(int):
                action._typehint = typing.Union[tuple([int, *(a for a in args if a is not int)])]  # noqa: UP007


def declared_type(parser: Any, key: str) -> Any:
    """The type ``parser`` checks the value of ``key`` against (``parser._actions``, ``action._typehint``), e.g.
    ``PositiveInt``, ``int | None``, ``Literal['a', 'b']``; a plain argparse option's ``type``; None for no such key.

    jsonargparse keeps a typed option's declared type only there (its ``action.type`` is None) and names neither
    the key nor the type in the attributes of the errors it raises."""
    for action in parser._actions:
        if action.dest == key:
            return getattr(action, "_typehint", None) or action.type
    return None


# -- torch ------------------------------------------------------------------------------------------------------


def cpu_has_native_bf16() -> bool:
    """``torch.ops.mkldnn._is_mkldnn_bf16_supported()``: whether oneDNN runs bf16 natively here (AVX512-BF16 or
    AMX); torch has no public query."""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def to_builtin(hparams: Any) -> None:
    """Turn jsonargparse's typed numbers (``PositiveInt``, ...) in saved hyper-parameters into plain
    ``int``/``float`` in place, so checkpoints load with PyTorch's safe unpickler."""
    for key, value in list(hparams.items()):
        if isinstance(value, int | float) and not isinstance(value, bool) and type(value) not in (int, float):
            hparams[key] = int(value) if isinstance(value, int) else float(value)


# -- jsonargparse: the import-path allow-list -----------------------------------------------------------------


@contextlib.contextmanager
def import_paths_only(allowed: Sequence[str]) -> Iterator[None]:
    """While the block runs, jsonargparse imports only ``allowed`` (dot paths and everything under them) from the
    values it parses and instantiates, and refuses any other path before importing it (``ImportDenied``): its own
    ``set_parsing_settings(import_path_denylist=["*"], import_path_allowlist=...)``. The settings are global and
    have no public reset, so the previous allow/deny verdicts and enforcement are put back afterwards."""
    from jsonargparse import _common, set_parsing_settings

    settings = _common.parsing_settings
    saved = dict(settings["import_path_verdicts"]), settings["import_paths_enforced"]
    set_parsing_settings(import_path_denylist=["*"], import_path_allowlist=list(allowed))
    try:
        yield
    finally:
        settings["import_path_verdicts"], settings["import_paths_enforced"] = saved
