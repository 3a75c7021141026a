"""The run's TensorBoard logger (:class:`RunTensorBoardLogger`) and where it writes: the run folder
(:func:`run_dir`) and rank 0's ``SummaryWriter`` (:func:`run_writer`)."""

from __future__ import annotations

import inspect
import os
import tempfile
import warnings
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.fabric.loggers.logger import rank_zero_experiment
from lightning.pytorch.core.saving import save_hparams_to_yaml
from lightning.pytorch.loggers import TensorBoardLogger as _TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_only

from project import adapters
from project.runs import files


def run_dir(trainer: L.Trainer) -> Path | None:
    """The run folder the trainer logs into, or ``None`` (no logger, or ``fast_dev_run``, which logs nothing)."""
    if trainer.logger is None or trainer.fast_dev_run or trainer.log_dir is None:
        return None
    return Path(os.path.abspath(trainer.log_dir))  # not resolve(): a link swapped in on the way is not followed


def run_writer(trainer: L.Trainer) -> Any:
    """The TensorBoard ``SummaryWriter`` of rank 0's logger, or ``None``."""
    # Not trainer.log_dir: under DDP that is a collective (a broadcast), and this runs on rank 0 only.
    if not trainer.is_global_zero or trainer.logger is None or trainer.fast_dev_run:
        return None
    writer = getattr(trainer.logger, "experiment", None)
    return writer if hasattr(writer, "add_custom_scalars") else None


class RunTensorBoardLogger(_TensorBoardLogger):
    """Lightning's ``TensorBoardLogger`` (same arguments, same files), minus the ``epoch`` scalar Lightning adds
    to every logging call: TensorBoard's TIME SERIES tab sorts tag groups by name and would open on that
    staircase. The epoch is still in every checkpoint, ``results.json`` and the per-epoch tags' steps. The
    model graph is written once per run folder (:meth:`log_graph`), not once per stage.

    Named apart from Lightning's class so that the shorthand ``--trainer.logger TensorBoardLogger`` names one class
    (jsonargparse refuses a short name two classes share); :class:`project.cli.parser.ProjectCLI` runs a Lightning
    ``TensorBoardLogger`` config as this class; the path ``project.report.TensorBoardLogger`` older runs'
    ``config.yaml`` name is upgraded to this one (:data:`project.cli.checks.MOVED_CLASS_PATHS`).

    Differences from Lightning's TensorBoardLogger, by Lightning's own tests (``scripts/upstream_tests.sh``):
    none fail (18 pass; the parent fails ``test_tensorboard_log_graph`` on torch's ``torch.jit.trace``
    FutureWarning, which :meth:`log_graph` filters). They do not assert the ``epoch`` scalar."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.graph_done = False

    @property
    @rank_zero_experiment
    def experiment(self) -> Any:
        """Lightning's ``SummaryWriter``, writing into the run folder through a descriptor of it: under a folder the
        user gave (:func:`project.runs.files.hold_below`, ``save_dir``), the writer is handed
        ``/proc/self/fd/N`` of the run folder opened without following links, so TensorBoard's event files, which
        the writer opens by path whenever a stage starts, land in that folder even if a component on the way is
        swapped for a link mid-run (refused with ``ELOOP`` when it already was). Elsewhere (no ``/proc``, a URL,
        a folder not held): Lightning's own."""
        if self._experiment is not None:
            return self._experiment
        path, fd = files.held_dir(self.log_dir)
        if fd is None:
            return super().experiment
        from torch.utils.tensorboard import SummaryWriter

        # kept open as long as the writer may open files by that path (every stage's new event file): closed with
        # the logger, so the number is never reused for another folder while the writer holds the path
        weakref.finalize(self, os.close, fd)
        self._experiment = SummaryWriter(log_dir=path, **adapters.writer_kwargs(self))
        return self._experiment

    @rank_zero_only
    def save(self) -> None:
        """Lightning's ``save`` (flush the writer, write ``hparams.yaml`` once), with ``hparams.yaml`` written by
        Lightning's ``save_hparams_to_yaml`` into a private folder and then into the run folder through
        :func:`project.runs.files.write_bytes` (atomic, no link followed under a held folder)."""
        self.experiment.flush()  # the parent's first step (which creates the writer if there is none yet)
        hparams_file = Path(self.log_dir) / self.NAME_HPARAMS_FILE
        if "://" in str(self.log_dir):
            return super().save()  # flushes again: harmless
        if not Path(self.log_dir).is_dir() or hparams_file.exists():
            return None
        with tempfile.TemporaryDirectory() as tmp:
            save_hparams_to_yaml(Path(tmp) / self.NAME_HPARAMS_FILE, self.hparams)
            files.write_bytes(hparams_file, (Path(tmp) / self.NAME_HPARAMS_FILE).read_bytes())
        return None

    # the parent's arguments, as inspect.signature reads them (help(), IDEs, jsonargparse, Lightning's own logger
    # tests, which pass save_dir only to a logger whose signature names it)
    __init__.__signature__ = inspect.signature(_TensorBoardLogger.__init__)  # type: ignore[attr-defined]

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        metrics = {k: v for k, v in metrics.items() if k != "epoch"}
        if metrics:
            super().log_metrics(metrics=metrics, step=step)

    @rank_zero_only
    def log_graph(self, model: Any, input_array: Any = None) -> None:
        """Lightning's GRAPHS-tab graph, written once per run folder.

        Lightning calls this at the start of every stage (``fit``, then ``test``: ``_log_hyperparams``), and each
        stage after the first writes into a new event file (its ``finalize`` closes the writer): the run folder
        held two graphs, and TensorBoard (and ``summarize`` on event files) warned "Found more than one graph
        event per run". So the first stage of this logger writes it, unless that stage starts from a checkpoint
        (``trainer.ckpt_path``: a resumed run, whose first start wrote it); later stages write none.

        TensorBoard's writer builds it with ``torch.jit.trace``: torch >= 2.10 deprecates that (two FutureWarnings on
        every run) and offers no replacement the writer can use yet; the trace also reads every property of every
        torchmetrics metric, deprecated ones included (one DeprecationWarning each). Both are filtered here, around
        this call only. The example input is cast by the Trainer's precision plugin, as every batch is (a
        ``*-true`` precision's net holds bf16, fp16 or fp64)."""
        trainer = attached_trainer(model)
        if self.graph_done or (trainer is not None and trainer.ckpt_path is not None):
            self.graph_done = True
            return
        with warnings.catch_warnings():
            warnings.filterwarnings(
                "ignore", message=r"`torch\.jit\.trace(_method)?` is deprecated", category=FutureWarning
            )
            warnings.filterwarnings(
                "ignore", message=r"This property will be removed in 2\.0\.0", category=DeprecationWarning
            )
            if input_array is None:
                input_array = getattr(model, "example_input_array", None)
            if input_array is not None and trainer is not None:
                # the precision plugin's own input cast, as for a batch: a *-true run's net is bf16/fp16/fp64
                input_array = trainer.precision_plugin.convert_input(input_array)
            super().log_graph(model, input_array)
        # Lightning traces a tensor or a tuple; for anything else it warns and writes nothing: a later call may
        self.graph_done = isinstance(input_array, torch.Tensor | tuple)


def attached_trainer(model: Any) -> L.Trainer | None:
    """The Trainer ``model`` is attached to (``LightningModule.trainer``), or ``None`` (a bare module)."""
    try:
        return getattr(model, "trainer", None)
    except RuntimeError:  # Lightning: "... is not attached to a `Trainer`"
        return None
