"""What a run reports: the ``results.json`` fields, the terminal summary, TensorBoard's HPARAMS entry."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import lightning as L
import torch

from project.callbacks import CudnnFlags, Pruning, Throughput, nonzero_params, sparsity


def callback(trainer: L.Trainer, cls: type) -> Any:
    """The trainer's first callback of type ``cls``, or ``None``."""
    return next((c for c in trainer.callbacks if isinstance(c, cls)), None)


def run_dir(trainer: L.Trainer) -> Path | None:
    """The run folder the trainer logs into, or ``None`` (no logger, or ``fast_dev_run``, which logs nothing)."""
    if trainer.logger is None or trainer.fast_dev_run or trainer.log_dir is None:
        return None
    return Path(trainer.log_dir).resolve()


def _abs(path: str | None) -> str | None:
    if not path:
        return None
    return path if "://" in path else str(Path(path).resolve())


def build_results(
    trainer: L.Trainer, model: Any, test_metrics: dict[str, float], test_ckpt: str | None, config: Any
) -> dict[str, Any]:
    """The ``results.json`` dict of a finished fit + test.

    Fields: accuracies and losses (fractions 0-1), ``epoch_time_s`` (seconds per epoch, training steps only),
    ``train_samples_per_s`` (median over epochs, all ranks), parameter counts, sparsity, the effective
    precision and cudnn flags, the data path, and the paths of the run.
    """
    ckpt_cb = trainer.checkpoint_callback
    pruning = callback(trainer, Pruning)
    throughput = callback(trainer, Throughput)
    stats = sparsity(pruning.named_targets()) if pruning is not None else {"global": 0.0}
    best = ckpt_cb.best_model_path if ckpt_cb is not None else ""
    flags = throughput.flags if throughput is not None and throughput.flags else CudnnFlags.in_effect()
    data = trainer.datamodule
    return {
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
        "requested_precision": str(config.trainer.precision),
        "auto_precision": bool(config.get("auto_precision")),
        **flags,
        "channels_last": bool(model.hparams.channels_last),
        "compile": bool(model.hparams.compile),
        "in_memory": bool(getattr(data, "hparams", {}).get("in_memory", False)),
        "test_samples": int(model.test_confusion.sum()),
        "confusion_matrix": model.test_confusion.tolist(),
        "best_ckpt": _abs(best),
        "last_ckpt": _abs(ckpt_cb.last_model_path if ckpt_cb else ""),
        "test_ckpt": _abs(best) if test_ckpt else "final weights",
        "log_dir": str(run_dir(trainer)) if run_dir(trainer) else None,
        "world_size": trainer.world_size,
        "accelerator": type(trainer.accelerator).__name__,
        "seed": config.seed_everything,
        "versions": {"torch": torch.__version__, "lightning": L.__version__},
    }


def log_hparams(trainer: L.Trainer, model: Any, results: dict[str, Any]) -> None:
    """Write the run's settings and final metrics to TensorBoard's HPARAMS tab (rank 0, once per run)."""
    data = trainer.datamodule
    hparams = {**model.hparams, **{f"data/{k}": v for k, v in data.hparams.items()}}
    hparams.update(precision=trainer.precision, max_epochs=trainer.max_epochs, seed=results["seed"])
    hparams.update({k: results[k] for k in ("cudnn_enabled", "cudnn_benchmark", "deterministic")})
    metrics = {f"hp/{k}": results[k] for k in ("test_acc", "best_val_acc", "sparsity", "train_samples_per_s")}
    trainer.logger.log_hyperparams(hparams, {k: v for k, v in metrics.items() if v is not None})


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
        ("results", f"{results['log_dir']}/results.json" if results["log_dir"] else "not written (no run folder)"),
    ]
    width = max(len(k) for k, _ in rows)
    print("\n".join(f"{k:<{width}}  {v}" for k, v in rows), flush=True)
