"""The run's per-epoch record, ``metrics.csv`` (:class:`EpochMetrics`)."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

from project.report.run_logger import run_dir
from project.runs import files, layout


def _number(value: Any) -> float | None:
    """A scalar metric as a float; None for anything else (a vector, a string)."""
    if isinstance(value, torch.Tensor):
        return float(value) if value.numel() == 1 else None
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


class EpochMetrics(Callback):
    """Writes the run's per-epoch record, ``metrics.csv`` (rank 0), one row per finished training epoch: ``epoch``,
    ``step`` (the epoch's last optimizer step, counted from 0, where TensorBoard shows its values), then every
    scalar Lightning holds at the end of that epoch (``trainer.callback_metrics``: ``train/acc``,
    ``train/loss_epoch``, ``val/acc``, ``val/loss``, ``train/epoch_time_s``, ``sparsity/*``, ...; a per-step value
    such as ``train/loss`` is the epoch's last).

    The layout of Lightning's ``CSVLogger`` (``epoch``, ``step``, one column per metric, empty where a metric was
    not logged), but one small file per run that ``summarize`` reads far faster than TensorBoard's event files
    (docs/decisions.md), and no second logger (which would change ``trainer.logger``, ``log_dir`` and where every
    logging call goes). The row of an epoch is written when the next epoch starts or training ends (the module
    logs its epoch-level training values after the callbacks' ``on_train_epoch_end``), through a temporary file
    and a rename, so a killed run leaves every finished epoch but the one it was killed in. A resumed run keeps
    the rows of the epochs its checkpoint has.
    """

    def __init__(self) -> None:
        self.path: Path | None = None
        self.rows: list[dict[str, float]] = []
        self.pending: int | None = None

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # on_train_start, not on_fit_start: a resumed run's epoch counter is restored in between
        run = run_dir(trainer)  # every rank: trainer.log_dir is a collective under DDP
        self.path = run / layout.METRICS_CSV if run is not None and trainer.is_global_zero else None
        self.pending = None
        self.rows = (
            [r for r in layout.read_epoch_metrics(run) if r["epoch"] < trainer.current_epoch] if self.path else []
        )

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.pending = trainer.current_epoch

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._write(trainer)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._write(trainer)

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._write(trainer)

    def _write(self, trainer: L.Trainer) -> None:
        if self.path is None or self.pending is None:
            return
        # the step TensorBoard (and Lightning's CSVLogger) shows epoch-end values at: the epoch's last optimizer step
        row: dict[str, float] = {"epoch": self.pending, "step": max(trainer.global_step - 1, 0)}
        for key, value in sorted(trainer.callback_metrics.items()):
            if key not in row and (number := _number(value)) is not None:
                row[key] = number
        self.rows.append(row)
        self.pending = None
        columns = list(dict.fromkeys(k for r in self.rows for k in r))
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows(self.rows)
        files.write_text(self.path, out.getvalue())  # whole or not at all, never through a planted link
