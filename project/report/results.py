"""What a run reports when it ends: the ``results.json`` fields (:func:`build_results`), its HPARAMS row
(:func:`log_hparams`) and the terminal summary (:func:`print_summary`); and TensorBoard's custom-scalars layout
(:class:`TensorBoardLayout`), written when it starts.

The rest of what a run reports lives in one module per job, re-exported here (configs and older runs'
``config.yaml`` name ``project.report.<Class>``):

* :mod:`project.report.run_logger` -- the TensorBoard logger (:class:`RunTensorBoardLogger`) and the run folder it
  writes into (:func:`run_dir`, :func:`run_writer`);
* :mod:`project.report.epoch_metrics` -- the per-epoch ``metrics.csv`` (:class:`EpochMetrics`);
* :mod:`project.report.figures` -- the test-set images and PR curves (:func:`write_test_report`).
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

from project.callbacks.pruning import ScheduledPruning, nonzero_params
from project.callbacks.training import CudnnFlags, Throughput
from project.nets import count_params, macs_per_sample, net_name, weights_bytes, widths_of
from project.report.run_logger import run_dir, run_writer
from project.runs import layout


def callback(trainer: L.Trainer, cls: type) -> Any:
    """The trainer's first callback of type ``cls``, or ``None``."""
    return next((c for c in trainer.callbacks if isinstance(c, cls)), None)


def _abs(path: str | None) -> str | None:
    if not path:
        return None
    return path if "://" in path else str(Path(path).resolve())


def build_results(
    trainer: L.Trainer, model: Any, test_metrics: dict[str, float], test_ckpt: str | None, config: Any
) -> dict[str, Any]:
    """The ``results.json`` dict of a finished fit + test.

    Fields: accuracies and losses (fractions 0-1), ``epoch_time_s`` (seconds per epoch, training steps only),
    ``train_samples_per_s`` (median over epochs, all ranks), parameter counts and multiply-accumulates per sample
    of the final net and of the net the run started with (``*_before``: they differ after structured pruning),
    its ``widths``, ``weights_bytes`` (the state dict saved alone) and ``checkpoint_bytes`` (``last.ckpt``, with
    optimizer state), sparsity, the effective precision and cudnn flags, the data path, and the paths of the run.
    The run's pruning callback fills in its own fields (:meth:`ScheduledPruning.results`).
    """
    ckpt_cb = trainer.checkpoint_callback
    pruning = callback(trainer, ScheduledPruning)
    last = ckpt_cb.last_model_path if ckpt_cb else ""
    throughput = callback(trainer, Throughput)
    best = ckpt_cb.best_model_path if ckpt_cb is not None else ""
    return (
        _scores(trainer, test_metrics, throughput)
        | _net_size(model, last)
        | _settings(trainer, model, config, throughput)
        | _test_and_paths(trainer, model, config, test_ckpt, best, last)
        | (pruning.results() if pruning is not None else {})
    )


def _scores(trainer: L.Trainer, test_metrics: dict[str, float], throughput: Any) -> dict[str, Any]:
    """``results.json``'s scores and training progress: test accuracy and loss, best validation accuracy
    (fractions 0-1), epochs and steps, ``train_samples_per_s`` (median over epochs) and ``epoch_time_s`` (seconds
    per epoch) from the run's :class:`Throughput` callback."""
    ckpt_cb = trainer.checkpoint_callback
    return {
        "test_acc": test_metrics.get("test/acc"),
        "test_loss": test_metrics.get("test/loss"),
        "best_val_acc": float(ckpt_cb.best_model_score) if ckpt_cb and ckpt_cb.best_model_score is not None else None,
        "epochs": trainer.current_epoch,
        "global_step": trainer.global_step,
        "train_samples_per_s": statistics.median(throughput.samples_per_s) if throughput.samples_per_s else None,
        "epoch_time_s": throughput.epoch_time_s,
    }


def _net_size(model: Any, last: str) -> dict[str, Any]:
    """``results.json``'s size of the final net: parameters and multiply-accumulates per sample (the same
    ``*_before`` until a pruning callback fills them in), nonzero parameters, widths, ``weights_bytes`` and
    ``checkpoint_bytes`` (the size of ``last``, ``None`` for a remote or missing file), and sparsity 0."""
    hp = model.hparams
    params = count_params(model.net)
    widths = widths_of(model.net)
    macs = macs_per_sample(hp.net, hp.num_classes, widths, model.input_shape)
    return {
        "params": params,
        "params_before": params,
        "nonzero_params": nonzero_params(model.net),
        "macs_per_sample": macs,
        "macs_per_sample_before": macs,
        "widths": widths,
        "weights_bytes": weights_bytes(model.net),
        "checkpoint_bytes": Path(last).stat().st_size if last and "://" not in last and Path(last).is_file() else None,
        "structured_pruning": None,
        "sparsity": 0.0,
        "sparsity_per_layer": {},
    }


def _settings(trainer: L.Trainer, model: Any, config: Any, throughput: Any) -> dict[str, Any]:
    """``results.json``'s settings in effect: precision (effective, requested, automatic), the cudnn flags (the
    :class:`Throughput` callback's, else :meth:`CudnnFlags.in_effect`), ``channels_last``, ``compile``,
    ``in_memory``, the fold (:func:`fold_of`) and whether every optimizer is fused."""
    flags = throughput.flags if throughput is not None and throughput.flags else CudnnFlags.in_effect()
    data = trainer.datamodule
    return {
        "precision": trainer.precision,
        "requested_precision": str(config.trainer.precision),
        "auto_precision": bool(config.get("auto_precision")),
        **flags,
        "channels_last": bool(model.hparams.channels_last),
        "compile": bool(model.hparams.compile),
        "in_memory": bool(getattr(data, "hparams", {}).get("in_memory", False)),
        **fold_of(data),
        "fused_optimizer": all(bool(o.defaults.get("fused")) for o in trainer.optimizers) and bool(trainer.optimizers),
    }


def _test_and_paths(
    trainer: L.Trainer, model: Any, config: Any, test_ckpt: str | None, best: str, last: str
) -> dict[str, Any]:
    """``results.json``'s test set (samples, confusion matrix), the run's paths (best and last checkpoint, the
    weights tested, the run folder; absolute), and where and with what it ran (world size, accelerator, seed,
    torch and Lightning versions)."""
    return {
        "test_samples": int(model.test_confusion.sum()),
        "confusion_matrix": model.test_confusion.tolist(),
        "best_ckpt": _abs(best),
        "last_ckpt": _abs(last),
        "test_ckpt": _abs(best) if test_ckpt else "final weights",
        "log_dir": str(run_dir(trainer)) if run_dir(trainer) else None,
        "world_size": trainer.world_size,
        "accelerator": type(trainer.accelerator).__name__,
        "seed": config.seed_everything,
        "versions": {"torch": torch.__version__, "lightning": L.__version__},
    }


def fold_of(data: Any) -> dict[str, int | None]:
    """``{"folds": K, "fold": k}`` of a K-fold run's data (``project.data.folds``); both ``None`` without folds."""
    hp = getattr(data, "hparams", {})
    folds = hp.get("folds")
    return {"folds": folds, "fold": hp.get("fold", 0) if folds is not None else None}


LAYOUT: dict[str, dict[str, list]] = {
    "Training": {
        "Loss (train, val; per epoch)": ["Multiline", ["train/loss_epoch", "val/loss"]],
        "Accuracy (train, val; per epoch)": ["Multiline", ["train/acc", "val/acc"]],
        "Learning rate": ["Multiline", [r"lr-.*"]],
        "Training loss (per step)": ["Multiline", ["train/loss"]],
    },
    "Speed": {
        "Training samples/s": ["Multiline", [r"train/(device/)?samples_per_sec"]],
        "Training FLOP/s": ["Multiline", [r"train/(device/)?flops_per_sec"]],
        "Epoch time (s)": ["Multiline", ["train/epoch_time_s"]],
    },
}


# The HPARAMS tab's metric columns: results.json key -> scalar tag, written once into the run's `hparams` session.
HP_METRICS = {
    "test_acc": "test/acc",
    "test_loss": "test/loss",
    "best_val_acc": "val/best_acc",
    "train_samples_per_s": "train/mean_samples_per_s",
    "sparsity": "test/sparsity",
    "nonzero_params": "test/nonzero_params",
    "params": "test/params",
    "params_before": "test/params_before",
    "macs_per_sample": "test/macs_per_sample",
    "macs_per_sample_before": "test/macs_per_sample_before",
    "checkpoint_bytes": "test/checkpoint_bytes",
}
# The sub-folder of a run folder that holds its HPARAMS session (TensorBoard shows it as the run `<run>/hparams`).
HPARAMS_RUN = layout.HPARAMS


class TensorBoardLayout(Callback):
    """Writes TensorBoard's custom-scalars layout (:data:`LAYOUT`, plus the ``charts`` of the run's pruning
    callbacks) once per run folder, on rank 0.

    Train and validation curves share a chart; the learning rate, throughput and (when pruning) sparsity get
    their own. A resumed run keeps the layout its first run wrote.
    """

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        writer = run_writer(trainer)
        if writer is None or trainer.ckpt_path is not None:
            return
        layout = dict(LAYOUT)
        for cb in trainer.callbacks:  # a pruning callback's own charts (sparsity, layer widths)
            if isinstance(cb, ScheduledPruning):
                layout |= cb.charts
        writer.add_custom_scalars(layout)


def hparams_of(trainer: L.Trainer, model: Any, results: dict[str, Any]) -> dict[str, Any]:
    """The settings a user compares runs by, as plain ``str``/``float``/``int``/``bool`` (no internal keys)."""
    opt = trainer.optimizers[0] if trainer.optimizers else None
    group = opt.param_groups[0] if opt is not None else {}
    scheds = trainer.lr_scheduler_configs
    pruning = callback(trainer, ScheduledPruning)
    data = trainer.datamodule
    return {
        "net": net_name(model.hparams.net),  # your own net: its class path
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
        "folds": int(results.get("folds") or 0),
        "fold": int(results["fold"]) if results.get("fold") is not None else -1,
    }


def callback_hparams(trainer: L.Trainer, run: Path) -> dict[str, Any]:
    """The HPARAMS columns the run's callbacks add: each callback with an ``extra_hparams(run) -> dict`` method
    (a sweep trial's ``project.sweep.ReportToStudy``: the trial number and the swept values) is asked."""
    extra: dict[str, Any] = {}
    for cb in trainer.callbacks:  # type: ignore[attr-defined]  # Lightning types Trainer.callbacks loosely
        method = getattr(cb, "extra_hparams", None)
        if callable(method):
            extra |= method(run)
    return extra


def log_hparams(trainer: L.Trainer, model: Any, results: dict[str, Any]) -> None:
    """Write the run's HPARAMS session (rank 0): :func:`hparams_of` (and :func:`callback_hparams`) as
    columns, :data:`HP_METRICS` as metric columns, into ``<run>/hparams/`` (:data:`HPARAMS_RUN`).

    TensorBoard's HParams plugin (``backend_context.Context.experiment_from_metadata``) takes the whole table's
    columns from the first ``_hparams_/experiment`` summary it finds under ``--logdir``, of whichever run; without
    one it builds them from every run's session (``_hparams_/session_start_info``): the union of their hparams,
    those whose values differ among the runs listed first, and as metrics the scalars inside the session folders.
    So no run writes an experiment summary, and each run's session and its metric scalars live in their own folder
    (the run's curves beside it would otherwise all become metric columns): any logdir -- one run, an experiment,
    a sweep, ``logs`` with fit runs and sweeps together -- shows every run's columns, a sweep trial's ``trial`` and
    swept keys included. Written with TensorBoard's own protos (its summary helper needs TensorFlow), so booleans
    stay booleans. A resumed run replaces its session.
    """
    from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
    from tensorboard.plugins.hparams import api_pb2, metadata, plugin_data_pb2
    from torch.utils.tensorboard import SummaryWriter

    if run_writer(trainer) is None or not results.get("log_dir"):
        return
    # results["log_dir"], not trainer.log_dir: under DDP that is a collective, and this runs on rank 0 only
    folder = Path(results["log_dir"]) / HPARAMS_RUN
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
        folder.unlink()  # the link itself: nothing is written through it
    folder.mkdir(exist_ok=True)
    for old in folder.glob(layout.EVENTS_GLOB):  # a resumed run's earlier session
        old.unlink()
    params = hparams_of(trainer, model, results) | callback_hparams(trainer, folder.parent)
    start = plugin_data_pb2.SessionStartInfo()
    for name, value in params.items():
        if isinstance(value, bool):
            start.hparams[name].bool_value = value
        elif isinstance(value, str):
            start.hparams[name].string_value = value
        else:
            start.hparams[name].number_value = value

    def summary(tag: str, **data: Any) -> Summary:
        content = plugin_data_pb2.HParamsPluginData(version=metadata.PLUGIN_DATA_VERSION, **data)
        plugin = SummaryMetadata.PluginData(plugin_name=metadata.PLUGIN_NAME, content=content.SerializeToString())
        return Summary(value=[Summary.Value(tag=tag, metadata=SummaryMetadata(plugin_data=plugin))])

    step = trainer.global_step
    writer = SummaryWriter(str(folder))
    file_writer = writer.file_writer
    assert file_writer is not None  # SummaryWriter opens it in __init__
    try:
        file_writer.add_summary(summary(metadata.SESSION_START_INFO_TAG, session_start_info=start), step)
        for key, tag in HP_METRICS.items():
            if results.get(key) is not None:
                writer.add_scalar(tag, float(results[key]), step)
        end = plugin_data_pb2.SessionEndInfo(status=api_pb2.STATUS_SUCCESS)
        file_writer.add_summary(summary(metadata.SESSION_END_INFO_TAG, session_end_info=end), step)
    finally:
        writer.close()


def _before_after(results: dict[str, Any], key: str) -> str:
    now, before = results.get(key), results.get(f"{key}_before")
    if now is None:
        return "-"
    return f"{before:,} -> {now:,}" if before is not None and before != now else f"{now:,}"


def print_summary(results: dict[str, Any]) -> None:
    """Print the headline numbers of a run as a two-column table."""
    rows = [
        ("test acc", f"{results['test_acc']:.4f}"),
        ("best val acc", f"{results['best_val_acc']:.4f}" if results["best_val_acc"] is not None else "-"),
        ("test loss", f"{results['test_loss']:.4f}"),
        ("epochs / steps", f"{results['epochs']} / {results['global_step']}"),
        ("train samples/s", f"{results['train_samples_per_s']:.0f}" if results["train_samples_per_s"] else "-"),
        ("epoch time (s)", ", ".join(f"{t:.1f}" for t in results["epoch_time_s"]) or "-"),
        ("params (nonzero)", f"{_before_after(results, 'params')} ({results['nonzero_params']:,})"),
        ("MACs per sample", _before_after(results, "macs_per_sample")),
        ("sparsity", f"{results['sparsity']:.4f}"),
        ("precision", results["precision"]),
        ("results", f"{results['log_dir']}/{layout.RESULTS}" if results["log_dir"] else "not written (no run folder)"),
    ]
    width = max(len(k) for k, _ in rows)
    print("\n".join(f"{k:<{width}}  {v}" for k, v in rows), flush=True)


def finish(trainer: L.Trainer, model: Any, metrics: dict[str, float], test_ckpt: str | None, config: Any) -> dict:
    """The end of a fit that trained and tested: the ``results.json`` dict (:func:`build_results`); on global rank
    0 its HPARAMS row (:func:`log_hparams`), the logger finalized, ``results.json`` written into the run folder
    (when there is one) and the summary printed. Returns the dict on every rank."""
    results = build_results(trainer, model, metrics, test_ckpt, config)
    log_dir = run_dir(trainer)  # on every rank: under DDP, trainer.log_dir is a broadcast
    if trainer.is_global_zero:
        if log_dir is not None:
            log_hparams(trainer, model, results)
            trainer.logger.finalize("success")
            layout.write_results(log_dir, results)
        print_summary(results)
    return results


def already_finished(trainer: L.Trainer, results: dict[str, Any]) -> dict[str, Any]:
    """The end of a resume with nothing left to do: the run's own ``results.json`` dict, its summary printed on
    global rank 0."""
    if trainer.is_global_zero:
        print_summary(results)
    return results
