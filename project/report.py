"""What a run reports: the ``results.json`` fields, the terminal summary, and TensorBoard: the custom-scalars
layout, the HPARAMS entry, the test-set images (confusion matrix, misclassified images) and PR curves."""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

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


LAYOUT: dict[str, dict[str, list]] = {
    "Training": {
        "Loss (train, val; per epoch)": ["Multiline", ["train/loss_epoch", "val/loss"]],
        "Accuracy (train, val; per epoch)": ["Multiline", ["train/acc", "val/acc"]],
        "Learning rate": ["Multiline", [r"lr-.*"]],
        "Training loss (per step)": ["Multiline", ["train/loss"]],
    },
    "Speed": {
        "Training samples/s": ["Multiline", ["train/samples_per_s"]],
        "Epoch time (s)": ["Multiline", ["train/epoch_time_s"]],
    },
    "Pruning": {"Sparsity (global, per layer)": ["Multiline", [r"sparsity/.*"]]},
}

KEY_HPARAMS = ("net", "dataset", "optimizer", "lr", "batch_size", "max_epochs", "precision", "pruning_amount", "seed")
HP_METRICS = ("test_acc", "test_loss", "best_val_acc", "train_samples_per_s", "sparsity", "nonzero_params")


def _writer(trainer: L.Trainer) -> Any:
    """The TensorBoard ``SummaryWriter`` of rank 0's logger, or ``None``."""
    # Not trainer.log_dir: under DDP that is a collective (a broadcast), and this runs on rank 0 only.
    if not trainer.is_global_zero or trainer.logger is None or trainer.fast_dev_run:
        return None
    writer = getattr(trainer.logger, "experiment", None)
    return writer if hasattr(writer, "add_custom_scalars") else None


class TensorBoardLayout(Callback):
    """Writes TensorBoard's custom-scalars layout (:data:`LAYOUT`) once per run folder, on rank 0.

    Train and validation curves share a chart; the learning rate, throughput and (when pruning) sparsity get
    their own. A resumed run keeps the layout its first run wrote.
    """

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        writer = _writer(trainer)
        if writer is None or trainer.ckpt_path is not None:
            return
        layout = {k: v for k, v in LAYOUT.items() if k != "Pruning" or callback(trainer, Pruning) is not None}
        writer.add_custom_scalars(layout)


def hparams_of(trainer: L.Trainer, model: Any, results: dict[str, Any]) -> dict[str, Any]:
    """The settings a user compares runs by, as plain ``str``/``float``/``int``/``bool`` (no internal keys)."""
    opt = trainer.optimizers[0] if trainer.optimizers else None
    group = opt.param_groups[0] if opt is not None else {}
    scheds = trainer.lr_scheduler_configs
    pruning = callback(trainer, Pruning)
    data = trainer.datamodule
    return {
        "net": model.hparams.net,
        "dataset": type(data).__name__.removesuffix("DataModule"),
        "optimizer": type(opt).__name__ if opt is not None else "none",
        "lr": float(group.get("max_lr", group.get("initial_lr", group.get("lr", 0.0)))),
        "weight_decay": float(group.get("weight_decay", 0.0)),
        "momentum": float(group.get("momentum", group.get("betas", (0.0,))[0]) or 0.0),
        "lr_scheduler": type(scheds[0].scheduler).__name__ if scheds else "none",
        "batch_size": int(data.hparams.batch_size),
        "max_epochs": int(trainer.max_epochs or -1),
        "precision": str(trainer.precision),
        "in_memory": bool(results["in_memory"]),
        "channels_last": bool(results["channels_last"]),
        "compile": bool(results["compile"]),
        "pruning": pruning.method if pruning is not None else "none",
        "pruning_amount": float(pruning.target) if pruning is not None else 0.0,
        "seed": int(results["seed"]) if results["seed"] is not None else -1,
    }


def trial_hparams(run: Path | None) -> dict[str, Any]:
    """A sweep trial's ``trial`` number and swept values (``params`` of the run's ``trial.json``, written by
    ``python -m project.sweep``), so HPARAMS compares the trials of a sweep by what the sweep varied."""
    try:
        info = json.loads((run / "trial.json").read_text()) if run is not None else {}
    except (OSError, ValueError):
        return {}
    if not isinstance(info, dict) or "run" not in info:
        return {}
    swept = {k: v if isinstance(v, bool | int | float | str) else str(v) for k, v in info.get("params", {}).items()}
    return {"trial": int(info["run"]), **swept}


def log_hparams(trainer: L.Trainer, model: Any, results: dict[str, Any]) -> None:
    """Write the run's HPARAMS entry once (rank 0): :func:`hparams_of` as columns, :data:`HP_METRICS` as metrics.

    Written with TensorBoard's own hparams protos (its summary helper needs TensorFlow), so booleans are
    booleans (torch's helper turns them into numbers). Each metric is also a scalar ``hp/<name>`` at the final
    step (the HPARAMS plugin reads metric values from scalars).
    """
    from google.protobuf import struct_pb2
    from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
    from tensorboard.plugins.hparams import api_pb2, metadata, plugin_data_pb2

    writer = _writer(trainer)
    if writer is None:
        return
    swept = trial_hparams(run_dir(trainer))
    params = hparams_of(trainer, model, results) | swept
    metrics = {f"hp/{k}": float(results[k]) for k in HP_METRICS if results.get(k) is not None}
    domains = {"precision": ["32-true", "16-mixed", "bf16-mixed", "bf16-true", "16-true", "64-true"]}
    infos, start = [], plugin_data_pb2.SessionStartInfo()
    for name, value in params.items():
        if isinstance(value, bool):
            kind, start.hparams[name].bool_value = api_pb2.DATA_TYPE_BOOL, value
        elif isinstance(value, str):
            kind, start.hparams[name].string_value = api_pb2.DATA_TYPE_STRING, value
        else:
            kind, start.hparams[name].number_value = api_pb2.DATA_TYPE_FLOAT64, value
        # TensorBoard lists (and ticks) hparams marked `differs` first: the ones users compare runs by.
        info = api_pb2.HParamInfo(name=name, type=kind, differs=name in KEY_HPARAMS or name in swept)
        if name in domains:
            info.domain_discrete.CopyFrom(struct_pb2.ListValue(values=[struct_pb2.Value(string_value=v)
                                                                         for v in domains[name]]))  # fmt: skip
        infos.append(info)
    experiment = api_pb2.Experiment(
        hparam_infos=infos, metric_infos=[api_pb2.MetricInfo(name=api_pb2.MetricName(tag=t)) for t in metrics]
    )
    for name, value in metrics.items():
        writer.add_scalar(name, value, trainer.global_step)

    def summary(tag: str, **data: Any) -> Summary:
        content = plugin_data_pb2.HParamsPluginData(version=metadata.PLUGIN_DATA_VERSION, **data)
        plugin = SummaryMetadata.PluginData(plugin_name=metadata.PLUGIN_NAME, content=content.SerializeToString())
        return Summary(value=[Summary.Value(tag=tag, metadata=SummaryMetadata(plugin_data=plugin))])

    for summary_pb in (
        summary(metadata.EXPERIMENT_TAG, experiment=experiment),
        summary(metadata.SESSION_START_INFO_TAG, session_start_info=start),
        summary(
            metadata.SESSION_END_INFO_TAG,
            session_end_info=plugin_data_pb2.SessionEndInfo(status=api_pb2.STATUS_SUCCESS),
        ),
    ):
        writer.file_writer.add_summary(summary_pb)
    writer.flush()


def confusion_figure(confusion: torch.Tensor, labels: list[str] | None = None) -> Any:
    """A matplotlib figure of a confusion matrix (rows: true class), readable at TensorBoard's card size.

    Cells are shaded by the row-normalized rate (recall) and print the count; class names label both axes.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    counts = confusion.cpu().numpy()
    rates = counts / counts.sum(1, keepdims=True).clip(min=1)
    n = len(counts)
    labels = labels or [str(i) for i in range(n)]
    fig, ax = plt.subplots(figsize=(6, 6), dpi=100)
    ax.imshow(rates, cmap="Blues", vmin=0, vmax=1)
    for i in range(n):
        for j in range(n):
            ax.text(j, i, int(counts[i, j]), ha="center", va="center", fontsize=8,
                    color="white" if rates[i, j] > 0.5 else "black")  # fmt: skip
    ax.set_xticks(range(n), labels, rotation=45, ha="right", fontsize=9)
    ax.set_yticks(range(n), labels, fontsize=9)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    acc = counts.trace() / max(counts.sum(), 1)
    ax.set_title(f"test confusion matrix (acc {acc:.4f}, {int(counts.sum())} images)", fontsize=10)
    fig.tight_layout()
    return fig


def misclassified_figure(wrong: list, mean: tuple, std: tuple, labels: list[str]) -> Any:
    """A grid of up to 64 misclassified test images, each titled ``true -> predicted``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = torch.cat([w[0] for w in wrong])[:64]
    true = torch.cat([w[1] for w in wrong])[:64]
    pred = torch.cat([w[2] for w in wrong])[:64]
    x = x * torch.tensor(std).view(1, -1, 1, 1) + torch.tensor(mean).view(1, -1, 1, 1)  # undo Normalize
    cols = 8
    rows = max(1, -(-len(x) // cols))
    fig, axes = plt.subplots(rows, cols, figsize=(cols * 1.3, rows * 1.5), dpi=100, squeeze=False)
    for i, ax in enumerate(axes.flat):
        ax.axis("off")
        if i < len(x):
            img = x[i].clamp(0, 1).permute(1, 2, 0).numpy()
            ax.imshow(img.squeeze(-1) if img.shape[-1] == 1 else img, cmap="gray" if img.shape[-1] == 1 else None)
            ax.set_title(f"{labels[int(true[i])]}\n-> {labels[int(pred[i])]}", fontsize=7)
    fig.suptitle("misclassified test images (true -> predicted)", fontsize=10)
    fig.tight_layout()
    return fig


def write_test_report(trainer: L.Trainer, model: Any) -> None:
    """After testing (rank 0): confusion matrix, misclassified images, per-class accuracy and PR curves.

    Tags: images ``test/confusion_matrix``, ``test/misclassified``; scalars ``test/class_acc/<class>``;
    PR curves ``test/pr/<class>``. Under DDP the images and PR curves cover rank 0's share of the test set,
    the confusion matrix and per-class accuracy all of it.
    """
    writer = _writer(trainer)
    if writer is None:
        return
    data, step = trainer.datamodule, trainer.global_step
    labels = list(getattr(data, "classes", None) or range(len(model.test_confusion)))
    labels = [str(x) for x in labels]
    confusion = model.test_confusion
    writer.add_figure("test/confusion_matrix", confusion_figure(confusion, labels), step)
    rows = confusion.sum(1).clamp(min=1)
    tags = [re.sub(r"[^A-Za-z0-9_.-]+", "_", name) for name in labels]  # "9 - nine" -> "9_-_nine"
    for i, tag in enumerate(tags):
        writer.add_scalar(f"test/class_acc/{tag}", float(confusion[i, i] / rows[i]), step)
    out = model.test_outputs
    if out["wrong"]:
        writer.add_figure("test/misclassified", misclassified_figure(out["wrong"], data.mean, data.std, labels), step)
    if out["probs"]:
        probs, targets = torch.cat(out["probs"]), torch.cat(out["targets"])
        for i, tag in enumerate(tags):
            writer.add_pr_curve(f"test/pr/{tag}", targets == i, probs[:, i], step)
    writer.flush()


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
