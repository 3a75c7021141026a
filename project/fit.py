"""``python -m project.fit``: train, test on the best checkpoint, write ``results.json``.

A thin ``LightningCLI`` (``run=False``) over :func:`fit`, which does the work and returns the metrics::

    python -m project.fit --config configs/fashion_mnist.yaml --trainer.max_epochs 2
    python -m project.fit --config configs/mnist.yaml --config configs/pruning.yaml
    python -m project.fit --config configs/mnist.yaml --ckpt_path logs/mnist/version_0/checkpoints/last.ckpt
    python -m project.fit --config configs/cifar10.yaml --print_config

Each run writes ``logs/<experiment>/version_N/`` with ``config.yaml``, TensorBoard event files,
``hparams.yaml``, ``checkpoints/`` (best by ``val/acc`` and ``last.ckpt``) and ``results.json``.
Bad input (unknown key, wrong type, missing data, ...) prints one ``error:`` line, exits non-zero and
leaves no run folder behind.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import statistics
import sys
import warnings
from pathlib import Path
from typing import Any

import lightning as L
import torch
from jsonargparse import ArgumentError
from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from project.callbacks import AtomicCheckpointIO, CudnnFlags, Pruning, Throughput, nonzero_params, sparsity
from project.data import VisionDataModule
from project.errors import ConfigError, UserError
from project.module import ImageClassifier

log = logging.getLogger("project")

DEFAULT_LOGGER = {
    "class_path": "lightning.pytorch.loggers.TensorBoardLogger",
    "init_args": {"save_dir": "logs", "name": "mnist", "default_hp_metric": False},
}
DEFAULT_DATA = {"class_path": "project.data.MNISTDataModule"}


class FitCLI(LightningCLI):
    """LightningCLI with the project's defaults: TensorBoard under ``logs/``, best/last checkpoints by
    ``val/acc``, learning-rate logging, the ``cudnn.enabled`` switch, atomic checkpoint writes and a
    ``--ckpt_path`` to resume from. Fails on bad input with :class:`ConfigError` or jsonargparse's
    ``ArgumentError`` before anything is written.
    """

    def __init__(self, args: list[str] | None = None) -> None:
        super().__init__(
            model_class=ImageClassifier,
            datamodule_class=VisionDataModule,
            subclass_mode_data=True,
            run=False,
            args=args,
            seed_everything_default=42,
            save_config_kwargs={"overwrite": True},
            parser_kwargs={"exit_on_error": False, "allow_abbrev": False, "description": __doc__.splitlines()[0]},
            auto_configure_optimizers=False,
        )

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_argument("--ckpt_path", type=str | None, default=None, help="checkpoint to resume training from")
        parser.add_lightning_class_args(ModelCheckpoint, "checkpoint")
        parser.add_lightning_class_args(LearningRateMonitor, "lr_monitor")
        parser.add_lightning_class_args(CudnnFlags, "cudnn")
        parser.set_defaults(
            {
                "data": DEFAULT_DATA,
                "trainer.logger": DEFAULT_LOGGER,
                "trainer.max_epochs": 2,
                "checkpoint.monitor": "val/acc",
                "checkpoint.mode": "max",
                "checkpoint.save_last": True,
                "checkpoint.filename": "epoch{epoch:02d}-val_acc{val/acc:.4f}",
                "checkpoint.auto_insert_metric_name": False,
                "lr_monitor.logging_interval": "step",
            }
        )

    def before_instantiate_classes(self) -> None:
        cfg = self.config
        if cfg.trainer.deterministic is True and cfg.trainer.benchmark:
            raise ConfigError(
                "trainer.deterministic: true and trainer.benchmark: true conflict (cudnn.benchmark picks "
                "kernels by timing them, which is not deterministic); set one of them to false"
            )
        if cfg.ckpt_path is not None:
            check_checkpoint(cfg.ckpt_path)
            self._resume_in_place(Path(cfg.ckpt_path).resolve())
        # Lightning says this as a long UserWarning with a source line; we say it once, plainly, below.
        warnings.filterwarnings("ignore", message=".*AMP with fp16 is not supported on CPU.*")
        # Our data modules define no on_after_batch_transfer, so the module's (channels_last) is the only one.
        warnings.filterwarnings("ignore", message=".*overridden `on_after_batch_transfer`.*")

    def _resume_in_place(self, ckpt: Path) -> None:
        """Resume into the run folder the checkpoint came from (``<save_dir>/<name>/version_N/checkpoints``).

        Lightning would start a new ``version_N+1``; ModelCheckpoint then forgets the best score so far, and
        the run's curves split over two folders. Only done when the checkpoint belongs to this experiment's
        folder and no logger version was set explicitly.
        """
        logger = self.config.trainer.logger
        args = getattr(logger, "init_args", None)
        if args is None or getattr(args, "version", 0) is not None or "TensorBoardLogger" not in logger.class_path:
            return
        run = ckpt.parent.parent
        if ckpt.parent.name != "checkpoints" or not re.fullmatch(r"version_\d+", run.name):
            return
        if run.parent == Path(args.save_dir, args.name).resolve():
            args.version = int(run.name.removeprefix("version_"))

    def instantiate_trainer(self, **kwargs: Any) -> L.Trainer:
        plugins = self.config_init.trainer.get("plugins") or []
        plugins = plugins if isinstance(plugins, list) else [plugins]
        if not any(hasattr(p, "save_checkpoint") for p in plugins):
            kwargs["plugins"] = [*plugins, AtomicCheckpointIO()]
        trainer = super().instantiate_trainer(**kwargs)
        trainer.callbacks.append(Throughput())
        requested = str(self.config.trainer.precision)
        requested = trainer.precision if requested == "None" else requested
        if requested != trainer.precision and trainer.is_global_zero:
            log.warning(
                "precision %r is not supported on %s; training with %r (recorded in results.json)",
                requested,
                type(trainer.accelerator).__name__.removesuffix("Accelerator").upper(),
                trainer.precision,
            )
        return trainer


def check_checkpoint(path: str) -> None:
    """Raise :class:`ConfigError` unless ``path`` is a Lightning checkpoint file."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(
            f"ckpt_path: {path} does not exist; point it at a .ckpt file, e.g. <run>/checkpoints/last.ckpt"
        )
    try:
        ckpt = torch.load(p, map_location="cpu", weights_only=False)
    except Exception as e:
        raise ConfigError(f"ckpt_path: {path} is not a readable checkpoint ({type(e).__name__}: {e})") from None
    if not isinstance(ckpt, dict) or "state_dict" not in ckpt or "loops" not in ckpt:
        raise ConfigError(f"ckpt_path: {path} is not a Lightning training checkpoint (no state_dict/loops)")


def _callback(trainer: L.Trainer, cls: type) -> Any:
    return next((c for c in trainer.callbacks if isinstance(c, cls)), None)


def _abs(path: str) -> str | None:
    return str(Path(path).resolve()) if path else None


def _atomic_write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


def fit(cli: LightningCLI) -> dict[str, Any]:
    """Fit, then test (on the best checkpoint, or on the final weights of a pruning run), and report.

    Returns:
        The ``results.json`` dict: accuracies and losses (fractions 0-1), ``epoch_time_s`` (seconds per
        epoch, training steps only), ``train_samples_per_s`` (median over epochs, all ranks), parameter
        counts, sparsity, the effective precision and cudnn flags, and the paths of the run.

    Raises:
        UserError: bad data or configuration found during the run, or a diverging loss. A run folder with
            no checkpoint in it is removed first.
    """
    trainer, model, data = cli.trainer, cli.model, cli.datamodule
    log_dir = Path(trainer.log_dir).resolve() if trainer.logger else None
    existed = log_dir is not None and log_dir.exists()
    try:
        trainer.fit(model, datamodule=data, ckpt_path=cli.config.ckpt_path)
    except BaseException:
        # Leave nothing half-made: a run folder without a single checkpoint is of no use to anyone.
        if trainer.is_global_zero and log_dir is not None and not existed and not any(log_dir.rglob("*.ckpt")):
            shutil.rmtree(log_dir, ignore_errors=True)
        raise
    ckpt_cb = trainer.checkpoint_callback
    pruning = _callback(trainer, Pruning)
    best = ckpt_cb.best_model_path if ckpt_cb is not None else ""
    # A pruning run is judged on its final, fully pruned weights: its best val/acc may predate pruning.
    test_ckpt = "best" if best and pruning is None else None
    test_metrics = trainer.test(model, datamodule=data, ckpt_path=test_ckpt, verbose=False)[0]

    throughput = _callback(trainer, Throughput)
    stats = sparsity(pruning.named_targets()) if pruning is not None else {"global": 0.0}
    results = {
        "test_acc": test_metrics.get("test/acc"),
        "test_loss": test_metrics.get("test/loss"),
        "best_val_acc": float(ckpt_cb.best_model_score) if ckpt_cb and ckpt_cb.best_model_score is not None else None,
        "epochs": trainer.current_epoch,
        "global_step": trainer.global_step,
        "train_samples_per_s": statistics.median(throughput.samples_per_s) if throughput.samples_per_s else None,
        "epoch_time_s": throughput.epoch_time_s,
        "params": sum(p.numel() for p in model.net.parameters()),
        "nonzero_params": nonzero_params(model.net),
        "sparsity": stats["global"],
        "sparsity_per_layer": {k: v for k, v in stats.items() if k != "global"},
        "precision": trainer.precision,
        "requested_precision": str(cli.config.trainer.precision),
        **throughput.flags,
        "channels_last": bool(model.hparams.channels_last),
        "compile": bool(model.hparams.compile),
        "test_samples": int(model.test_confusion.sum()),
        "confusion_matrix": model.test_confusion.tolist(),
        "best_ckpt": _abs(best),
        "last_ckpt": _abs(ckpt_cb.last_model_path if ckpt_cb else ""),
        "test_ckpt": _abs(best) if test_ckpt else "final weights",
        "log_dir": str(log_dir) if log_dir else None,
        "world_size": trainer.world_size,
        "accelerator": type(trainer.accelerator).__name__,
        "seed": cli.config.seed_everything,
        "versions": {"torch": torch.__version__, "lightning": L.__version__},
    }
    if trainer.is_global_zero and log_dir is not None:
        hparams = {**model.hparams, **{f"data/{k}": v for k, v in data.hparams.items()}}
        hparams.update(precision=trainer.precision, max_epochs=trainer.max_epochs, seed=cli.config.seed_everything)
        hparams.update({k: results[k] for k in ("cudnn_enabled", "cudnn_benchmark", "deterministic")})
        metrics = {f"hp/{k}": results[k] for k in ("test_acc", "best_val_acc", "sparsity", "train_samples_per_s")}
        trainer.logger.log_hyperparams(hparams, {k: v for k, v in metrics.items() if v is not None})
        trainer.logger.finalize("success")
        _atomic_write_json(log_dir / "results.json", results)
        print_summary(results)
    return results


def print_summary(results: dict[str, Any]) -> None:
    """Print the headline numbers of a run as a two-column table."""
    rows = [
        ("test acc", f"{results['test_acc']:.4f}"),
        ("best val acc", f"{results['best_val_acc']:.4f}" if results["best_val_acc"] is not None else "-"),
        ("test loss", f"{results['test_loss']:.4f}"),
        ("epochs / steps", f"{results['epochs']} / {results['global_step']}"),
        ("train samples/s", f"{results['train_samples_per_s']:.0f}" if results["train_samples_per_s"] else "-"),
        ("epoch time (s)", ", ".join(f"{t:.1f}" for t in results["epoch_time_s"]) or "-"),
        ("params (nonzero)", f"{results['params']:,} ({results['nonzero_params']:,})"),
        ("sparsity", f"{results['sparsity']:.4f}"),
        ("precision", results["precision"]),
        ("results", f"{results['log_dir']}/results.json"),
    ]
    width = max(len(k) for k, _ in rows)
    print("\n".join(f"{k:<{width}}  {v}" for k, v in rows), flush=True)


_GENERIC = ("Expected a <class 'NoneType'>", "Not a valid subclass", "a class path", "a dict ")


def explain_parse_error(message: str) -> str:
    """Boil jsonargparse's multi-line type error down to one line: the key, the value, what was expected.

    A ``ConfigError`` raised while a class was instantiated (e.g. ``data.batch_size: must be >= 1``) is
    passed through as it is.
    """
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    errors = [line[2:] for line in lines if line.startswith("- ")]
    specific = [e for e in errors if not e.startswith(_GENERIC) and not e.startswith("Expected a ")]
    if specific:
        return specific[0]
    key = re.search(r'Parser key "([^"]+)"', message)
    given = re.search(r"(?:Given|Got) value: (.*)", message)
    single = re.search(r"Expected a (.*?)\. Got value", message)
    if single:
        errors = [f"Expected a {single.group(1)}"]
    expected = [
        e.removeprefix("Expected a ") for e in errors if e.startswith("Expected a ") and not e.startswith(_GENERIC)
    ]
    expected = [re.sub(r"<class '(\w+)'>", r"\1", e).replace("typing.Literal", "one of ") for e in expected]
    if key and given:
        return f"{key.group(1)}: invalid value {given.group(1)!r}; expected {' or '.join(expected) or 'another type'}"
    return lines[0] if lines else message


def main(args: list[str] | None = None) -> int:
    """Entry point of ``python -m project.fit``; returns the exit status (0 ok, 1 bad data/run, 2 bad config)."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s: %(message)s")
    # Lightning advertises a cloud logger on every start; this project logs to TensorBoard.
    logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(lambda r: "litlogger" not in r.getMessage())
    try:
        cli = FitCLI(args)
    except (ArgumentError, ValueError) as e:
        if not isinstance(e, (ArgumentError, ConfigError)) and "Does not validate" not in str(e):
            raise
        print(f"error: {explain_parse_error(str(e))} (see --help)", file=sys.stderr)
        return 2
    try:
        fit(cli)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
