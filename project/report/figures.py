"""What a run shows of its test set in TensorBoard: the confusion matrix and misclassified images (matplotlib
figures), per-class accuracy and PR curves (:func:`write_test_report`)."""

from __future__ import annotations

import math
import re
from typing import Any

import lightning as L
import torch

from project.report.run_logger import run_writer

# Up to this many classes a cell prints its count and every class is named on the axes; above it (CIFAR-100) the
# numbers would not be readable at the card's size and 10,000 text artists take matplotlib about 12 s to draw on a
# 2-core CPU, so the cells are shaded only and every k-th class is named (the counts: evaluate's JSON).
CELL_TEXT_MAX = 20


def confusion_figure(confusion: torch.Tensor, labels: list[str] | None = None) -> Any:
    """A matplotlib figure of a confusion matrix ((C, C) counts, rows: true class), readable at TensorBoard's card
    size.

    Cells are shaded by the row-normalized rate (recall); with up to :data:`CELL_TEXT_MAX` classes each prints its
    count and class names label both axes, above it every k-th class is named so that about 20 are.
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
    for i in range(n if n <= CELL_TEXT_MAX else 0):
        for j in range(n):
            ax.text(
                j,
                i,
                str(int(counts[i, j])),
                ha="center",
                va="center",
                fontsize=8,
                color="white" if rates[i, j] > 0.5 else "black",
            )
    ticks = range(0, n, math.ceil(n / CELL_TEXT_MAX))
    ax.set_xticks(ticks, [labels[i] for i in ticks], rotation=45, ha="right", fontsize=9)
    ax.set_yticks(ticks, [labels[i] for i in ticks], fontsize=9)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    acc = f"{counts.trace() / counts.sum():.4f}" if counts.sum() > 0 else "undefined"
    ax.set_title(f"test confusion matrix (acc {acc}, {int(counts.sum())} images)", fontsize=10)
    fig.tight_layout()
    return fig


def misclassified_figure(wrong: list, mean: tuple, std: tuple, labels: list[str]) -> Any:
    """A 4-column grid of up to 16 misclassified test images, each titled ``true -> predicted`` in a font that
    reads at TensorBoard's default card size.

    Drawn as one image in one matplotlib axes (the titles are text in bands above each row), which lays out much
    faster than sixteen titled axes (docs/decisions.md).
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
    ax.imshow(
        img.squeeze(-1) if channels == 1 else img,
        cmap="gray" if channels == 1 else None,
        vmin=0,
        vmax=1,
        aspect="auto",
        interpolation="nearest",
    )
    for i in range(count):
        r, c = divmod(i, cols)
        title = f"{labels[int(true[i])]}\n-> {labels[int(pred[i])]}"
        ax.text(
            c * (w + pad) + (w + pad) / 2 - 0.5,
            r * (band + h) + band - 1.5,
            title,
            ha="center",
            va="bottom",
            fontsize=11,
        )
    fig.suptitle("misclassified test images\n(true -> predicted)", fontsize=12, y=0.995, va="top")
    return fig


class TestReport(L.Callback):
    """Writes :func:`write_test_report` when testing ends (rank 0), before the Trainer closes its logger.

    ``fit`` adds it for its own test; it is not a config key: no setting changes it, and ``evaluate`` (no logger)
    has nowhere to write."""

    def on_test_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.is_global_zero:
            write_test_report(trainer, pl_module)


def class_accuracies(confusion: Any) -> list[float | None]:
    """Each class's accuracy from a confusion matrix ((C, C) counts, rows: true class): right / images of that
    class, a fraction in [0, 1], or ``None`` for a class without images, which has no accuracy (not 0.0: nothing
    was misclassified, nothing was classified)."""
    rows = confusion.sum(1)
    return [float(confusion[i, i] / rows[i]) if rows[i] > 0 else None for i in range(len(rows))]


def write_test_report(trainer: L.Trainer, model: Any) -> None:
    """After testing (rank 0): confusion matrix, misclassified images, per-class accuracy and PR curves.

    Tags: images ``test/confusion_matrix``, ``test/misclassified``; scalars ``test/class_acc/<class>`` (none for a
    class without test images);
    PR curves ``test/pr/<class>``. Under DDP the images and PR curves cover rank 0's share of the test set,
    the confusion matrix and per-class accuracy all of it.
    """
    writer = run_writer(trainer)
    if writer is None:
        return
    data, step = trainer.datamodule, trainer.global_step
    labels = list(getattr(data, "classes", None) or range(len(model.test_confusion)))
    labels = [str(x) for x in labels]
    confusion = model.test_confusion
    writer.add_figure("test/confusion_matrix", confusion_figure(confusion, labels), step)
    tags = [re.sub(r"[^A-Za-z0-9_.-]+", "_", name) for name in labels]  # "9 - nine" -> "9_-_nine"
    for tag, acc in zip(tags, class_accuracies(confusion)):
        if acc is not None:  # a class without test images has no accuracy: no point, rather than a 0.0
            writer.add_scalar(f"test/class_acc/{tag}", acc, step)
    out = model.test_outputs
    if out["wrong"]:
        writer.add_figure("test/misclassified", misclassified_figure(out["wrong"], data.mean, data.std, labels), step)
    if out["probs"]:
        probs, targets = torch.cat(out["probs"]), torch.cat(out["targets"])
        for i, tag in enumerate(tags):
            writer.add_pr_curve(f"test/pr/{tag}", targets == i, probs[:, i], step)
    writer.flush()
