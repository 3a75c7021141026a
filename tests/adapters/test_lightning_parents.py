"""The project's Lightning subclasses take their parents' arguments (found by Lightning's own tests for the parents,
scripts/upstream_tests.sh): a parent's keyword works on ours and does what it does on the parent."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.loggers import Logger, TensorBoardLogger

from project.callbacks.checkpoint import RunCheckpoint
from project.callbacks.training import StepLearningRateMonitor, Throughput
from project.report import RunTensorBoardLogger


class Recorder(Logger):
    """Keeps every ``log_metrics`` call as ``(step, metrics)``."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[int | None, dict[str, float]]] = []

    @property
    def name(self) -> str:
        return "recorder"

    @property
    def version(self) -> int:
        return 0

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        pass

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.calls.append((step, dict(metrics)))


def fit(callback: L.Callback, model: L.LightningModule, steps: int = 4, **trainer_args: Any) -> Recorder:
    logger = Recorder()
    trainer = L.Trainer(
        **trainer_args,
        max_steps=steps,
        limit_val_batches=0,
        log_every_n_steps=1,
        logger=logger,
        callbacks=[callback],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
    )
    trainer.fit(model)
    return logger


def test_run_checkpoint_signature_is_model_checkpoint_s():
    ours, parent = inspect.signature(RunCheckpoint), inspect.signature(ModelCheckpoint)
    assert list(ours.parameters) == list(parent.parameters)
    assert ours.parameters["save_last"].annotation == parent.parameters["save_last"].annotation
    assert ours.parameters["save_top_k"].default == 1
    assert RunCheckpoint(save_top_k=3, monitor="val/acc", mode="max").save_top_k == 3


@pytest.mark.parametrize("accumulate", [1, 2, 3])
def test_the_learning_rate_is_logged_once_per_optimizer_step(accumulate):
    """With ``accumulate_grad_batches`` the batches of one optimizer step share its rate: one scalar per step, the
    rate of that step (a scheduler halving it every step); the same callback object logs a second fit again."""

    class Halving(BoringModel):
        def configure_optimizers(self):
            optimizer = torch.optim.SGD(self.parameters(), lr=0.08)
            return [optimizer], [{"scheduler": torch.optim.lr_scheduler.StepLR(optimizer, 1, 0.5), "interval": "step"}]

    monitor = StepLearningRateMonitor()
    for _ in range(2):
        logger = fit(monitor, Halving(), steps=4, accumulate_grad_batches=accumulate)
        lr = [(step, m["lr-SGD"]) for step, m in logger.calls if "lr-SGD" in m]
        assert lr == [(0, 0.08), (1, 0.04), (2, 0.02), (3, 0.01)]


def test_run_tensorboard_logger_signature_is_tensorboard_logger_s(tmp_path):
    """Lightning's own logger tests (tests_pytorch/loggers/test_all.py) pass ``save_dir`` only to a logger whose
    ``inspect.getfullargspec(cls).args`` names it: a ``(*args, **kwargs)`` signature hid it."""
    ours, parent = inspect.signature(RunTensorBoardLogger), inspect.signature(TensorBoardLogger)
    assert list(ours.parameters) == list(parent.parameters)
    assert ours.parameters["save_dir"].annotation == parent.parameters["save_dir"].annotation
    assert ours.parameters["name"].default == "lightning_logs"
    assert {"save_dir", "name", "version"} <= set(inspect.getfullargspec(RunTensorBoardLogger).args)
    logger = RunTensorBoardLogger(save_dir=tmp_path, name="x", version=3, default_hp_metric=False, flush_secs=5)
    assert (logger.save_dir, logger.name, logger.version) == (str(tmp_path), "x", 3)
    assert Path(logger.log_dir) == tmp_path / "x" / "version_3"


def test_throughput_takes_batch_size_fn_length_fn_and_separator():
    seen = []

    def batch_size(batch: torch.Tensor) -> int:
        seen.append(len(batch))
        return 5  # not BoringModel's 2 samples per batch: counted by this function, not by ours

    monitor = Throughput(window_size=2, batch_size_fn=batch_size, length_fn=lambda batch: 7, separator="|")
    model = BoringModel()
    model.train_dataloader = lambda: torch.utils.data.DataLoader(torch.randn(64, 32), batch_size=2)
    logger = fit(monitor, model, steps=3)
    last = [m for _, m in logger.calls if "train|samples" in m][-1]
    assert seen == [2, 2, 2]
    assert last["train|samples"] == 15
    assert last["train|batches"] == 3
    assert last["train|lengths"] == 21
    assert "train|device|samples_per_sec" in last


def test_step_lr_monitor_takes_log_momentum_and_weight_decay():
    class SGDModel(BoringModel):
        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9, weight_decay=0.01)

    logger = fit(StepLearningRateMonitor(log_momentum=True, log_weight_decay=True), SGDModel(), steps=3)
    lr = [(step, m) for step, m in logger.calls if "lr-SGD" in m]
    assert [step for step, _ in lr] == [0, 1, 2]
    assert lr[0][1] == {"lr-SGD": 0.05, "lr-SGD-momentum": 0.9, "lr-SGD-weight_decay": 0.01}
