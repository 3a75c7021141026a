"""``ImageClassifier``: the LightningModule that trains either recipe net.

Loss is cross-entropy (both recipes). Accuracy uses one torchmetrics object per stage, logged as
metric objects so Lightning accumulates correct/total over the whole epoch (and across DDP ranks)
instead of averaging per-batch accuracies.
"""

from __future__ import annotations

from typing import Any, Literal

import lightning as L
import torch
import torch.nn.functional as F
from torchmetrics.classification import MulticlassAccuracy, MulticlassConfusionMatrix

from project.errors import DivergenceError, require
from project.nets import NETS, build_net


class ImageClassifier(L.LightningModule):
    """Train one of the recipe nets (:mod:`project.nets`) on (N, C, H, W) float batches.

    Args:
        net: ``"lenet"`` (recipe B, 1x28x28 input) or ``"simple_cnn"`` (recipe A, 3x32x32 input).
        num_classes: number of output logits.
        optimizer: ``"sgd"`` (the recipes' choice), ``"adam"`` or ``"adamw"``.
        lr: learning rate (> 0); the peak rate when ``scheduler="onecycle"``.
        momentum: SGD momentum (the recipes use 0).
        nesterov: SGD Nesterov momentum.
        weight_decay: L2 penalty (SGD/Adam) or decoupled decay (AdamW).
        scheduler: ``None``, ``"onecycle"`` (per step, Smith & Topin 2017), ``"cosine"`` (per step,
            to 0 at the last step) or ``"step"`` (StepLR, per epoch: ``lr *= gamma`` every ``step_size`` epochs).
        step_size: epochs between decays for ``scheduler="step"``.
        gamma: decay factor for ``scheduler="step"``.
        channels_last: keep the net's weights and each input batch in ``torch.channels_last`` memory format.
        compile: compile the net's forward with ``torch.compile`` (``nn.Module.compile``, so parameter names,
            checkpoints and pruning are unchanged).

    Raises:
        ConfigError: a value out of range (e.g. ``lr <= 0``), naming the ``model.*`` key.
    """

    def __init__(
        self,
        net: Literal["lenet", "simple_cnn"] = "lenet",
        num_classes: int = 10,
        optimizer: Literal["sgd", "adam", "adamw"] = "sgd",
        lr: float = 0.01,
        momentum: float = 0.0,
        nesterov: bool = False,
        weight_decay: float = 0.0,
        scheduler: Literal["onecycle", "cosine", "step"] | None = None,
        step_size: int = 1,
        gamma: float = 0.1,
        channels_last: bool = False,
        compile: bool = False,
    ) -> None:
        super().__init__()
        require(net in NETS, "model.net", f"unknown net {net!r}; choose one of {sorted(NETS)}")
        require(num_classes >= 2, "model.num_classes", f"must be >= 2, got {num_classes}")
        require(lr > 0, "model.lr", f"must be > 0, got {lr}")
        require(0 <= momentum < 1, "model.momentum", f"must be in [0, 1), got {momentum}")
        require(weight_decay >= 0, "model.weight_decay", f"must be >= 0, got {weight_decay}")
        require(step_size >= 1, "model.step_size", f"must be >= 1, got {step_size}")
        require(0 < gamma <= 1, "model.gamma", f"must be in (0, 1], got {gamma}")
        require(not (nesterov and optimizer != "sgd"), "model.nesterov", "only applies to optimizer: sgd")
        require(not (nesterov and momentum == 0), "model.nesterov", "needs model.momentum > 0")
        self.save_hyperparameters()
        self.net = build_net(net, num_classes)
        self.example_input_array = torch.zeros(1, *self.net.input_shape)
        self.train_acc = MulticlassAccuracy(num_classes, average="micro")
        self.val_acc = MulticlassAccuracy(num_classes, average="micro")
        self.test_acc = MulticlassAccuracy(num_classes, average="micro")
        self.test_confmat = MulticlassConfusionMatrix(num_classes)
        if channels_last:
            self.net.to(memory_format=torch.channels_last)

    def configure_model(self) -> None:
        if self.hparams.compile and not getattr(self, "_compiled", False):
            self.net.compile()
            self._compiled = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits (N, num_classes) for a float batch (N, C, H, W)."""
        return self.net(x)

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        if self.hparams.channels_last:
            x, y = batch
            batch = (x.contiguous(memory_format=torch.channels_last), y)
        return batch

    def _shared_step(self, batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x, y = batch
        logits = self(x)
        loss = F.cross_entropy(logits.float(), y)
        return loss, logits, y

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss, logits, y = self._shared_step(batch)
        if not torch.isfinite(loss):
            raise DivergenceError(
                f"training loss became {loss.item()} at global step {self.global_step} "
                f"(epoch {self.current_epoch}, batch {batch_idx}); lower model.lr (now {self.hparams.lr}), "
                "add a scheduler warm-up or use 32-true precision. The last good checkpoint is kept."
            )
        self.train_acc.update(logits, y)  # epoch-level only: update() skips the per-batch compute of __call__
        self.log("train/loss", loss, on_step=True, on_epoch=True, prog_bar=True, batch_size=len(y))
        self.log("train/acc", self.train_acc, on_step=False, on_epoch=True, prog_bar=True)
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        loss, logits, y = self._shared_step(batch)
        self.val_acc.update(logits, y)
        self.log("val/loss", loss, prog_bar=True, batch_size=len(y), sync_dist=True)
        self.log("val/acc", self.val_acc, prog_bar=True)

    def test_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        loss, logits, y = self._shared_step(batch)
        self.test_acc.update(logits, y)
        self.test_confmat.update(logits, y)
        self.log("test/loss", loss, batch_size=len(y), sync_dist=True)
        self.log("test/acc", self.test_acc)

    def on_test_epoch_start(self) -> None:
        self.test_confmat.reset()

    def on_test_epoch_end(self) -> None:
        # compute() syncs across DDP ranks, so every rank holds the full-test-set matrix (rows: true class).
        self.test_confusion = self.test_confmat.compute().cpu()
        writer = getattr(self.logger, "experiment", None) if self.logger else None
        if self.trainer.is_global_zero and hasattr(writer, "add_figure"):
            labels = getattr(self.trainer.datamodule, "classes", None)
            fig, _ = self.test_confmat.plot(val=self.test_confusion, labels=labels)
            fig.set_size_inches(8, 8)
            writer.add_figure("test/confusion_matrix", fig, global_step=self.global_step)

    def configure_optimizers(self) -> Any:
        hp = self.hparams
        params = self.parameters()
        if hp.optimizer == "sgd":
            opt = torch.optim.SGD(
                params, lr=hp.lr, momentum=hp.momentum, nesterov=hp.nesterov, weight_decay=hp.weight_decay
            )
        elif hp.optimizer == "adam":
            opt = torch.optim.Adam(params, lr=hp.lr, weight_decay=hp.weight_decay)
        else:
            opt = torch.optim.AdamW(params, lr=hp.lr, weight_decay=hp.weight_decay)
        if hp.scheduler is None:
            return opt
        if hp.scheduler == "onecycle":
            steps = int(self.trainer.estimated_stepping_batches)
            sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=hp.lr, total_steps=steps)
            interval = "step"
        elif hp.scheduler == "cosine":
            steps = int(self.trainer.estimated_stepping_batches)
            sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps)
            interval = "step"
        else:
            sched = torch.optim.lr_scheduler.StepLR(opt, step_size=hp.step_size, gamma=hp.gamma)
            interval = "epoch"
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": interval}}
