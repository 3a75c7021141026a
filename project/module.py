"""``ImageClassifier``: the LightningModule that trains either recipe net.

Loss is cross-entropy (both recipes). Accuracy uses one torchmetrics object per stage, logged as
metric objects so Lightning accumulates correct/total over the whole epoch (and across DDP ranks)
instead of averaging per-batch accuracies. The optimizer and LR scheduler are injected (LightningCLI's
``OptimizerCallable`` / ``LRSchedulerCallable``), so any ``torch.optim`` class works from YAML.
"""

from __future__ import annotations

import inspect
import logging
import math
import os
from collections.abc import Callable
from typing import Any, Literal, cast

import lightning as L
import torch
import torch.nn.functional as F
from jsonargparse.typing import PositiveInt
from lightning.fabric.utilities.data import AttributeDict
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import nn
from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassAccuracy, MulticlassConfusionMatrix

from project.adapters import to_builtin
from project.checkpoints import read_checkpoint
from project.errors import ConfigError, DivergenceError
from project.nets import (
    NETS,
    build_net,
    check_logits,
    is_recipe_net,
    net_input_shape,
    net_spec,
    train_flops_per_sample,
    widths_of,
)

log = logging.getLogger("project")


class ImageClassifier(L.LightningModule):
    """Train one of the recipe nets (:mod:`project.nets`) on (N, C, H, W) float batches.

    Args:
        net: ``"lenet"`` (recipe B, 1x28x28 input), ``"simple_cnn"`` (recipe A, 3x32x32 input), or your own
            ``torch.nn.Module`` class by class path, ``{class_path: mypkg.MyNet, init_args: {...}}``: it is called
            as ``MyNet(num_classes, **init_args)`` and must map (N, C, H, W) float images of ``input_shape`` to
            (N, num_classes) logits (checked here on the ``meta`` device). From Python also a class, or that
            mapping. Hyper-parameters and checkpoints hold the mapping; its class is never imported from them
            (:func:`project.nets.net_class`).
        num_classes: number of output logits (linked to the data module's by the CLI).
        input_shape: (C, H, W) of the data's images (linked to the data module's by the CLI); a recipe net must
            take it, your own net is fed it.
        optimizer: any ``torch.optim`` class with its settings, e.g.
            ``{class_path: torch.optim.SGD, init_args: {lr: 0.01}}``; default ``torch.optim.SGD`` with its
            default lr 0.001 (recipe B's).
        lr_scheduler: any ``torch.optim.lr_scheduler`` class, or none. ``OneCycleLR`` (Smith & Topin 2017) gets
            ``total_steps`` from the run's length (``trainer.estimated_stepping_batches``) unless set, and
            ``CosineAnnealingLR`` likewise ``T_max`` when it is 0.
        lr_scheduler_interval: when the scheduler steps: ``"step"`` or ``"epoch"``; default ``"step"`` for
            schedulers sized in steps (one-cycle, cosine with ``T_max`` from the run), else ``"epoch"``.
        channels_last: keep the net's weights and each input batch in ``torch.channels_last`` memory format.
        compile: compile the net's forward with ``torch.compile`` (``nn.Module.compile``, so parameter names,
            checkpoints and pruning are unchanged).
        widths: the net's layer widths, e.g. LeNet's ``{"channels": [20, 50], "hidden": [500]}``; default (null):
            the recipe's. Structured pruning (:class:`project.callbacks.StructuredPruning`) narrows the net during
            training and records the new widths here, so checkpoints carry them in their hyper-parameters and
            :meth:`on_load_checkpoint` rebuilds the slimmed shape before the weights load strictly.

    Raises:
        ConfigError: the net does not take the data's image shape or give (N, num_classes) logits, or ``widths``
            does not fit the net (your own net has no widths).
    """

    def __init__(
        self,
        net: Literal["lenet", "simple_cnn"] | Callable[[int], nn.Module] = "lenet",
        num_classes: PositiveInt = 10,
        input_shape: tuple[int, int, int] | None = None,
        optimizer: OptimizerCallable = torch.optim.SGD,
        lr_scheduler: LRSchedulerCallable | None = None,
        lr_scheduler_interval: Literal["step", "epoch"] | None = None,
        channels_last: bool = False,
        compile: bool = False,
        widths: dict[str, list[int]] | None = None,
    ) -> None:
        super().__init__()
        if num_classes < 2:
            raise ConfigError(f"model.num_classes: must be >= 2, got {num_classes}")
        # logger=False: the run's HPARAMS entry is written once, at the end, by project.report
        self.save_hyperparameters(ignore=["optimizer", "lr_scheduler"], logger=False)
        to_builtin(self.hparams)
        try:
            self.hparams["net"] = net_spec(net)  # plain data: a name, or {class_path, init_args}
        except ValueError as e:
            raise ConfigError(str(e)) from None
        self.optimizer, self.lr_scheduler = optimizer, lr_scheduler
        self.net: nn.Module = self._build(widths)
        if not is_recipe_net(self.hparams.net):
            try:
                #: (C, H, W) of the images the net is fed
                self.input_shape = net_input_shape(self.hparams.net, input_shape)
                check_logits(self.hparams.net, num_classes, self.input_shape)
            except ValueError as e:
                raise ConfigError(str(e)) from None
        elif input_shape is not None and tuple(input_shape) != tuple(NETS[net].input_shape):  # type: ignore[index]
            shape = "x".join(map(str, input_shape))
            fits = [name for name, cls in NETS.items() if tuple(cls.input_shape) == tuple(input_shape)]
            takes = ", ".join(f"{name} {'x'.join(map(str, cls.input_shape))}" for name, cls in NETS.items())
            fix = (
                f"use model.net {' or '.join(fits)} or another data module"
                if fits
                else f"no net takes {shape}: bring the data to a net's images ({takes}; an image folder's "
                "data.channels and data.image_size)"
            )
            raise ConfigError(
                f"model.net: {net} takes {'x'.join(map(str, NETS[net].input_shape))} images but the data gives "  # type: ignore[index]
                f"{shape}; {fix}"
            )
        else:
            self.input_shape = net_input_shape(self.hparams.net)
        self.example_input_array = torch.zeros(1, *self.input_shape)
        self.train_acc = MulticlassAccuracy(num_classes, average="micro")
        self.train_loss = MeanMetric()
        self.val_acc = MulticlassAccuracy(num_classes, average="micro")
        self.test_acc = MulticlassAccuracy(num_classes, average="micro")
        self.test_confmat = MulticlassConfusionMatrix(num_classes)
        self.val_confmat = MulticlassConfusionMatrix(num_classes)
        if channels_last:
            self.net.to(memory_format=torch.channels_last)

    @property
    def hparams(self) -> AttributeDict:
        """Lightning's ``hparams`` (what ``save_hyperparameters`` saved), typed as the ``AttributeDict`` it is."""
        return cast(AttributeDict, super().hparams)

    def _build(self, widths: dict[str, Any] | None) -> nn.Module:
        try:
            return build_net(self.hparams.net, self.hparams.num_classes, widths)
        except (TypeError, ValueError) as e:
            raise ConfigError(str(e) if "model." in str(e) else f"model.widths: {e}") from None

    def set_widths(self, widths: dict[str, Any] | None) -> bool:
        """Give the net these layer widths: rebuild it (freshly initialised) unless it has them already.

        Used before a slimmed checkpoint's weights load into a net built from the run's config. The new net takes
        the old one's device, dtype, memory format and compilation; the global RNG is left as it was, so a resumed
        run draws the same random numbers as an uninterrupted one. Records ``widths`` in ``hparams``.

        Returns:
            Whether the net was rebuilt (never for your own net, which has no widths).

        Raises:
            ConfigError: ``widths`` does not fit the net, or are given for your own net.
        """
        if widths is None and not is_recipe_net(self.hparams.net):
            return False
        target = self._build_widths(widths)
        if target == widths_of(self.net):
            self.hparams["widths"] = widths
            return False
        first = next(self.net.parameters())
        with torch.random.fork_rng(devices=[]):
            net = self._build(widths).to(device=first.device, dtype=first.dtype)
        if self.hparams.channels_last:
            net.to(memory_format=torch.channels_last)
        if getattr(self, "_compiled", False):
            net.compile()
        self.net = net
        self.hparams["widths"] = widths
        return True

    def _build_widths(self, widths: dict[str, Any] | None) -> dict[str, list[int]] | None:
        with torch.device("meta"):
            return widths_of(self._build(widths))

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Rebuild the net with the checkpoint's widths (``hyper_parameters.widths``) before its weights load.

        A checkpoint is data from elsewhere, and its widths a size read from it: they are checked against its
        weights (:func:`check_weights`) before a net of that shape is allocated, so loading takes no more memory
        than the file's tensors honestly hold.

        Raises:
            ConfigError: the widths do not fit the net, or do not match the checkpoint's ``state_dict``.
        """
        hparams = checkpoint.get("hyper_parameters")
        if isinstance(hparams, dict) and "widths" in hparams:
            check_weights(self.hparams.net, self.hparams.num_classes, hparams["widths"], checkpoint.get("state_dict"))
            self.set_widths(hparams["widths"])

    @classmethod
    def load_from_checkpoint(
        cls,
        checkpoint_path: Any,
        map_location: Any = None,
        hparams_file: Any = None,
        strict: bool | None = None,
        weights_only: bool | None = None,
        **kwargs: Any,
    ) -> Any:
        """Lightning's ``load_from_checkpoint``, after checking the file and its hyper-parameters (``net``,
        ``num_classes``, ``widths``, with ``kwargs`` over them) against its weights on the meta device
        (:func:`check_weights`): Lightning builds the module from the hyper-parameters before any hook runs, so a
        small file claiming a huge net would be allocated first. The file is read by
        :func:`project.checkpoints.read_checkpoint` (the safe unpickler, records checked first, unless
        ``weights_only=False``). A file object or an ``hparams_file`` goes to Lightning unchecked.

        Raises:
            ConfigError: the file is unreadable, needs more than the safe unpickler (unless
                ``weights_only=False``), its records are compressed or larger than the file, or its hyper-parameters
                do not match its weights.
        """
        if isinstance(checkpoint_path, str | os.PathLike) and hparams_file is None:
            checkpoint = read_checkpoint(checkpoint_path, trust=weights_only is False)
            hparams = checkpoint.get("hyper_parameters") if isinstance(checkpoint, dict) else None
            if isinstance(hparams, dict) and "state_dict" in checkpoint:
                hparams = {**hparams, **kwargs}
                try:
                    check_weights(
                        hparams.get("net", "lenet"),
                        hparams.get("num_classes", 10),
                        hparams.get("widths"),
                        checkpoint["state_dict"],
                    )
                except ConfigError as e:
                    raise ConfigError(f"{checkpoint_path}: {e}") from None
            del checkpoint
        return super().load_from_checkpoint(checkpoint_path, map_location, hparams_file, strict, weights_only, **kwargs)

    def configure_model(self) -> None:
        if self.hparams.compile and not getattr(self, "_compiled", False):
            self.net.compile()
            self._compiled = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits (N, num_classes) for a float batch (N, C, H, W), in the net's dtype.

        A float batch is cast to the dtype of the net's weights first: under a ``*-true`` precision
        (``bf16-true``, ``16-true``, ``64-true``) Lightning's precision plugin casts the weights and every batch of
        a step (``convert_input``), but not the ``example_input_array`` its ``ModelSummary`` runs through the
        net at the start of fit (Lightning 2.6: "Input type (float) and bias type (c10::BFloat16) should be the
        same"), nor a float32 batch given to the module directly. Otherwise the cast is a no-op."""
        weight = next(self.net.parameters(), None)  # None: a net without parameters (a test double) keeps x
        if weight is not None and x.is_floating_point() and x.dtype != weight.dtype:
            x = x.to(weight.dtype)
        if self.hparams.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        return self.net(x)

    def _shared_step(self, batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x, y = batch
        logits = self(x)
        loss = F.cross_entropy(logits.float(), y)
        return loss, logits, y

    @property
    def flops_per_batch(self) -> float | None:
        """Training FLOPs (forward + backward) of the last training batch, for Lightning's ``ThroughputMonitor``
        (``train/flops_per_sec``): :func:`project.nets.train_flops_per_sample` of the net's current widths times
        the batch's samples. None before the first training step."""
        samples = getattr(self, "_batch_samples", None)
        if samples is None:
            return None
        widths = widths_of(self.net)
        key = repr(widths)
        if getattr(self, "_flops_key", None) != key:
            self._flops_key = key
            self._flops_per_sample = train_flops_per_sample(
                self.hparams.net, self.hparams.num_classes, widths, self.input_shape
            )
        return self._flops_per_sample * samples

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        self._batch_samples = len(batch[1])
        loss, logits, y = self._shared_step(batch)
        if not torch.isfinite(loss):
            raise DivergenceError(
                f"training loss became {loss.item()} at global step {self.global_step} "
                f"(epoch {self.current_epoch}, batch {batch_idx}); lower the learning rate (model.optimizer), "
                "add a scheduler warm-up or use 32-true precision. The last good checkpoint is kept."
            )
        # Epoch-level values are only accumulated here and logged once in on_train_epoch_end: each self.log call
        # costs Lightning's result bookkeeping (about 1 ms on a CPU, a tenth of a LeNet step at batch 64).
        self.train_acc.update(logits, y)
        self.train_loss.update(loss.detach(), weight=len(y))
        self.log("train/loss", loss, on_step=True, on_epoch=False, prog_bar=True)
        return loss

    def on_train_epoch_end(self) -> None:
        """Logs ``train/loss_epoch`` (mean over the epoch's samples) and ``train/acc``, all ranks together."""
        if self.train_loss.update_count:
            self.log("train/loss_epoch", self.train_loss)
            self.log("train/acc", self.train_acc, prog_bar=True)

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        loss, logits, y = self._shared_step(batch)
        self.val_acc.update(logits, y)
        self.val_confmat.update(logits, y)
        self.log("val/loss", loss, prog_bar=True, batch_size=len(y), sync_dist=True)
        self.log("val/acc", self.val_acc, prog_bar=True)

    def test_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        loss, logits, y = self._shared_step(batch)
        self.test_acc.update(logits, y)
        self.test_confmat.update(logits, y)
        self.log("test/loss", loss, batch_size=len(y), sync_dist=True)
        self.log("test/acc", self.test_acc)
        # for the report (rank 0's share under DDP): class probabilities, and the first misclassified images
        probs = torch.softmax(logits.float(), dim=1)
        self.test_outputs["probs"].append(probs.cpu())
        self.test_outputs["targets"].append(y.cpu())
        wrong = (probs.argmax(1) != y).nonzero().flatten()[: 16 - self.test_outputs["n_wrong"]]  # 16 are shown
        if len(wrong):
            self.test_outputs["wrong"].append((x[wrong].float().cpu(), y[wrong].cpu(), probs[wrong].argmax(1).cpu()))
            self.test_outputs["n_wrong"] += len(wrong)

    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> torch.Tensor:
        """Class probabilities (N, num_classes), float32, rows summing to 1 (softmax of the logits).

        ``batch`` is x (N, C, H, W) or ``(x, y)``; the data modules' ``predict_dataloader`` gives either, so
        ``Trainer.predict(model, datamodule=dm)`` works on the test set or on image files (``dm.predict_on``).
        """
        x = batch[0] if isinstance(batch, tuple | list) else batch
        return torch.softmax(self(x).float(), dim=1)

    def on_validation_epoch_start(self) -> None:
        self.val_confmat.reset()

    def on_validation_epoch_end(self) -> None:
        """Keeps ``val_confusion``, the validation split's confusion matrix (num_classes, num_classes), int64, rows:
        true class, all ranks together (``python -m project.evaluate --split val`` reads it)."""
        self.val_confusion = self.val_confmat.compute().cpu()

    def on_test_epoch_start(self) -> None:
        self.test_confmat.reset()
        self.test_outputs: dict[str, Any] = {"probs": [], "targets": [], "wrong": [], "n_wrong": 0}

    def on_test_epoch_end(self) -> None:
        # compute() syncs across DDP ranks, so every rank holds the full-test-set matrix (rows: true class).
        self.test_confusion = self.test_confmat.compute().cpu()

    def configure_optimizers(self) -> Any:
        try:
            opt = self.optimizer(self.parameters())
        except (TypeError, ValueError) as e:
            raise ConfigError(f"model.optimizer: {e}") from None
        if opt.defaults.get("fused") and self.trainer.gradient_clip_val and self.trainer.precision.endswith("-mixed"):
            # Lightning refuses to clip the gradients of a fused optimizer under any *-mixed precision (a fused
            # step unscales 16-mixed gradients itself, after clipping would have run); the unfused step computes
            # the same update, so the run clips with it.
            log.info(
                "gradient clipping under %s precision: %s runs unfused", self.trainer.precision, type(opt).__name__
            )
            opt = cast(Callable[..., torch.optim.Optimizer], self.optimizer)(self.parameters(), fused=False)
        if self.lr_scheduler is None:
            return opt
        kwargs: dict[str, Any] = {}
        given = getattr(self.lr_scheduler, "keywords", {})
        # jsonargparse's callable is partial(instantiator, class, **init_args); look at the class itself.
        cls = next((a for a in getattr(self.lr_scheduler, "args", ()) if isinstance(a, type)), self.lr_scheduler)
        params = inspect.signature(cls).parameters
        length_key = None  # the scheduler's length argument that the run's length fills in, if not given
        if "total_steps" in params and given.get("total_steps") is None:
            length_key = "total_steps"
        elif "T_max" in params and not given.get("T_max"):
            length_key = "T_max"
        if length_key is not None:
            steps = self.trainer.estimated_stepping_batches
            if not math.isfinite(steps):
                raise ConfigError(
                    f"model.lr_scheduler: {cls.__name__} is sized by the run's length, but trainer.max_epochs -1 "
                    "without trainer.max_steps trains forever; set one of them, or the scheduler's own length"
                )
            kwargs[length_key] = int(steps)
        try:
            sched = self.lr_scheduler(opt, **kwargs)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"model.lr_scheduler: {e}") from None
        interval = self.hparams.lr_scheduler_interval or ("step" if length_key else "epoch")
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": interval}}


def check_weights(net: Any, num_classes: Any, widths: Any, state_dict: Any) -> None:
    """Check, without allocating the net, that a checkpoint's weights are those of ``net`` at ``num_classes`` and
    ``widths`` (sizes read from the checkpoint).

    The net is built on the meta device (shapes, no storage); ``state_dict`` must hold exactly its parameter names
    (``net.*``) and shapes, as tensors that hold their own bytes: a tensor viewing fewer bytes than its size (e.g.
    ``torch.zeros(1).expand(10**6, 800)``, which a file stores as one number) is refused. So a small file claiming
    a large net is refused before anything of that size is built.

    Raises:
        ConfigError: naming the first parameter that differs.
    """
    try:
        with torch.device("meta"):
            built = build_net(net, num_classes, widths)
    except (TypeError, ValueError, RuntimeError, OverflowError, MemoryError) as e:  # absurd sizes overflow on meta
        raise ConfigError(
            f"hyper_parameters (net {net!r}, num_classes {num_classes!r}, widths {widths!r}) do not give a net ({e})"
        ) from None
    if not isinstance(state_dict, dict):
        raise ConfigError("its state_dict is not a mapping of parameter names to tensors")
    expected = {f"net.{k}": tuple(v.shape) for k, v in built.state_dict().items()}
    got = {k: v for k, v in state_dict.items() if isinstance(k, str) and k.startswith("net.")}
    for key in sorted(expected.keys() | got.keys()):
        tensor = got.get(key)
        shape = tuple(tensor.shape) if isinstance(tensor, torch.Tensor) else None
        if shape != expected.get(key):
            held = "missing" if key not in got else "x".join(map(str, shape)) if shape is not None else "no tensor"
            want = "x".join(map(str, expected[key])) if key in expected else "no such parameter"
            what = f"widths {widths!r}" if widths is not None else f"num_classes {num_classes!r}"
            raise ConfigError(
                f"hyper_parameters.{what} do not match its weights ({key}: {held} in the file, {want} by the "
                "hyper-parameters); the checkpoint is inconsistent, not loaded"
            )
    needed, held_bytes = 0, dict[int, int]()
    for key, tensor in got.items():
        storage = tensor.untyped_storage()
        size = tensor.numel() * tensor.element_size()
        if size > storage.nbytes():
            raise ConfigError(
                f"{key} claims {size} bytes but the file holds {storage.nbytes()} for it; the checkpoint is "
                "inconsistent, not loaded"
            )
        needed += size
        held_bytes[storage.data_ptr()] = max(held_bytes.get(storage.data_ptr(), 0), storage.nbytes())
    if needed > sum(held_bytes.values()):
        raise ConfigError(
            f"its weights claim {needed} bytes but share {sum(held_bytes.values())} bytes of storage; the checkpoint "
            "is inconsistent, not loaded"
        )
