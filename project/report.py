"""What a run reports: the ``results.json`` fields, the per-epoch ``metrics.csv``, the terminal summary, and
TensorBoard: the custom-scalars layout, the HPARAMS entry, the test-set images (confusion matrix, misclassified
images) and PR curves."""

from __future__ import annotations

import csv
import io
import json
import math
import re
import statistics
import warnings
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import TensorBoardLogger as _TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_only

from project import runs
from project.callbacks import CudnnFlags, Pruning, Throughput, nonzero_params, sparsity
from project.slim import StructuredPruning, count_params, macs_per_sample, weights_bytes


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
    ``train_samples_per_s`` (median over epochs, all ranks), parameter counts and multiply-accumulates per sample
    of the final net and of the net the run started with (``*_before``: they differ after structured pruning),
    its ``widths``, ``weights_bytes`` (the state dict saved alone) and ``checkpoint_bytes`` (``last.ckpt``, with
    optimizer state), sparsity, the effective precision and cudnn flags, the data path, and the paths of the run.
    """
    ckpt_cb = trainer.checkpoint_callback
    pruning = callback(trainer, Pruning)
    slimming = callback(trainer, StructuredPruning)
    hp = model.hparams
    params = count_params(model.net)
    macs = macs_per_sample(hp.net, hp.num_classes, model.net.widths())
    before = {"params": params, "macs_per_sample": macs}
    if slimming is not None and slimming.before:
        before = slimming.before
    last = ckpt_cb.last_model_path if ckpt_cb else ""
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
        "params": params,
        "params_before": before["params"],
        "nonzero_params": nonzero_params(model.net),
        "macs_per_sample": macs,
        "macs_per_sample_before": before["macs_per_sample"],
        "widths": model.net.widths(),
        "weights_bytes": weights_bytes(model.net),
        "checkpoint_bytes": Path(last).stat().st_size if last and "://" not in last and Path(last).is_file() else None,
        "structured_pruning": slimming.schedule() if slimming is not None else None,
        "sparsity": stats["global"],
        "sparsity_per_layer": {k: v for k, v in stats.items() if k != "global"},
        "precision": trainer.precision,
        "requested_precision": str(config.trainer.precision),
        "auto_precision": bool(config.get("auto_precision")),
        **flags,
        "channels_last": bool(model.hparams.channels_last),
        "compile": bool(model.hparams.compile),
        "in_memory": bool(getattr(data, "hparams", {}).get("in_memory", False)),
        "fused_optimizer": all(bool(o.defaults.get("fused")) for o in trainer.optimizers) and bool(trainer.optimizers),
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
    "Pruning": {"Sparsity (global, per layer)": ["Multiline", [r"sparsity/.*"]]},
    "Structured pruning": {
        "Parameters": ["Multiline", ["slim/params"]],
        "MACs per sample": ["Multiline", ["slim/macs_per_sample"]],
        "Layer widths": ["Multiline", [r"slim/width/.*"]],
    },
}


class RunTensorBoardLogger(_TensorBoardLogger):
    """Lightning's ``TensorBoardLogger`` (same arguments, same files), minus the ``epoch`` scalar Lightning adds
    to every logging call: TensorBoard's TIME SERIES tab sorts tag groups by name and would open on that
    staircase. The epoch is still in every checkpoint, ``results.json`` and the per-epoch tags' steps. The
    model graph is written once per run folder (:meth:`log_graph`), not once per stage.

    Named apart from Lightning's class so that the shorthand ``--trainer.logger TensorBoardLogger`` names one class
    (jsonargparse refuses a short name two classes share); :class:`project.cli.ProjectCLI` runs a Lightning
    ``TensorBoardLogger`` config as this class. ``project.report.TensorBoardLogger`` (older runs' ``config.yaml``)
    is the same class.

    Differences from Lightning's TensorBoardLogger, by Lightning's own tests (``scripts/upstream_tests.sh``):
    none fail (18 pass; the parent fails ``test_tensorboard_log_graph`` on torch's ``torch.jit.trace``
    FutureWarning, which :meth:`log_graph` filters). They do not assert the ``epoch`` scalar."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.graph_done = False

    @rank_zero_only
    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
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


TensorBoardLogger = RunTensorBoardLogger  # the class path older runs' config.yaml names

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
HPARAMS_RUN = "hparams"


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
        wanted = {"Pruning": Pruning, "Structured pruning": StructuredPruning}
        layout = {k: v for k, v in LAYOUT.items() if k not in wanted or callback(trainer, wanted[k]) is not None}
        writer.add_custom_scalars(layout)


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
    not logged), but one small file per run that ``summarize`` reads in a millisecond where TensorBoard's event
    files took ~45 ms, and no second logger (which would change ``trainer.logger``, ``log_dir`` and where every
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
        self.path = run / runs.METRICS_CSV if run is not None and trainer.is_global_zero else None
        self.pending = None
        self.rows = [r for r in runs.read_epoch_metrics(run) if r["epoch"] < trainer.current_epoch] if self.path else []

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
        runs.write_text(self.path, out.getvalue())  # whole or not at all, never through a planted link


def hparams_of(trainer: L.Trainer, model: Any, results: dict[str, Any]) -> dict[str, Any]:
    """The settings a user compares runs by, as plain ``str``/``float``/``int``/``bool`` (no internal keys)."""
    opt = trainer.optimizers[0] if trainer.optimizers else None
    group = opt.param_groups[0] if opt is not None else {}
    scheds = trainer.lr_scheduler_configs
    pruning = callback(trainer, Pruning) or callback(trainer, StructuredPruning)
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
        "pruning_amount": float(pruning.target if isinstance(pruning, Pruning) else pruning.amount) if pruning else 0.0,
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
    """Write the run's HPARAMS session (rank 0): :func:`hparams_of` (and a sweep trial's :func:`trial_hparams`) as
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

    if _writer(trainer) is None or not results.get("log_dir"):
        return
    # results["log_dir"], not trainer.log_dir: under DDP that is a collective, and this runs on rank 0 only
    folder = Path(results["log_dir"]) / HPARAMS_RUN
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
        folder.unlink()  # the link itself: nothing is written through it
    folder.mkdir(exist_ok=True)
    for old in folder.glob("events.out.tfevents.*"):  # a resumed run's earlier session
        old.unlink()
    params = hparams_of(trainer, model, results) | trial_hparams(folder.parent)
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
    try:
        writer.file_writer.add_summary(summary(metadata.SESSION_START_INFO_TAG, session_start_info=start), step)
        for key, tag in HP_METRICS.items():
            if results.get(key) is not None:
                writer.add_scalar(tag, float(results[key]), step)
        end = plugin_data_pb2.SessionEndInfo(status=api_pb2.STATUS_SUCCESS)
        writer.file_writer.add_summary(summary(metadata.SESSION_END_INFO_TAG, session_end_info=end), step)
    finally:
        writer.close()


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
    """A 4-column grid of up to 16 misclassified test images, each titled ``true -> predicted`` in a font that
    reads at TensorBoard's default card size.

    Drawn as one image in one matplotlib axes (the titles are text in bands above each row): sixteen axes with
    their own titles took about a second to lay out, at the end of every run.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n, cols = 16, 4
    x = torch.cat([w[0] for w in wrong])[:n]
    true = torch.cat([w[1] for w in wrong])[:n]
    pred = torch.cat([w[2] for w in wrong])[:n]
    x = x * torch.tensor(std).view(1, -1, 1, 1) + torch.tensor(mean).view(1, -1, 1, 1)  # undo Normalize
    x = x.clamp(0, 1)
    count, channels, h, w = x.shape
    rows = max(1, -(-count // cols))
    pad = w // 8  # gap between columns (pixels)
    scale = 1.6 / (w + pad)  # inches per pixel: each column 1.6 inches wide
    band = math.ceil(0.5 / scale)  # a two-line title band of 0.5 inches above each image (pixels)
    canvas = torch.ones(channels, rows * (band + h), cols * (w + pad))
    for i in range(count):
        r, c = divmod(i, cols)
        top, left = r * (band + h) + band, c * (w + pad) + pad // 2
        canvas[:, top : top + h, left : left + w] = x[i]
    grid_h = rows * (band + h) * scale  # inches
    fig = plt.figure(figsize=(cols * 1.6, grid_h + 0.6), dpi=100)
    ax = fig.add_axes((0, 0, 1, grid_h / (grid_h + 0.6)))
    ax.axis("off")
    img = canvas.permute(1, 2, 0).numpy()
    ax.imshow(img.squeeze(-1) if channels == 1 else img, cmap="gray" if channels == 1 else None, vmin=0, vmax=1,
              aspect="auto", interpolation="nearest")  # fmt: skip
    for i in range(count):
        r, c = divmod(i, cols)
        title = f"{labels[int(true[i])]}\n-> {labels[int(pred[i])]}"
        ax.text(c * (w + pad) + (w + pad) / 2 - 0.5, r * (band + h) + band - 1.5, title,
                ha="center", va="bottom", fontsize=11)  # fmt: skip
    fig.suptitle("misclassified test images\n(true -> predicted)", fontsize=12, y=0.995, va="top")
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
        ("results", f"{results['log_dir']}/results.json" if results["log_dir"] else "not written (no run folder)"),
    ]
    width = max(len(k) for k, _ in rows)
    print("\n".join(f"{k:<{width}}  {v}" for k, v in rows), flush=True)
