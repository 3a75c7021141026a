"""``python -m project.evaluate RUN [--ckpt best|last|FILE] [--split test|val] [overrides...]``.

Rebuilds model and data from the run folder's own config (overrides allowed: another ``--data.data_dir``,
``--data.batch_size``, ``--trainer.accelerator``...), loads the checkpoint with PyTorch's safe unpickler,
evaluates one split with Lightning's ``Trainer.test`` (``test``) or ``Trainer.validate`` (``val``: the seeded
validation split fit held out) and writes ``eval-<ckpt>-<split>.json`` into the run folder: accuracy, loss,
per-class accuracy, the confusion matrix (rows: true class) and the number of samples. On the run's unchanged
config ``--ckpt best --split test`` reproduces ``results.json``'s ``test_acc``. The shared run-folder arguments and
loading: :mod:`project.cli.commands`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, cast

from lightning.pytorch.cli import LightningArgumentParser

from project.cli.commands import Command, RunJob, main_of
from project.cli.entry import exit_with
from project.report.figures import class_accuracies
from project.runs import files, layout


def add_arguments(parser: LightningArgumentParser) -> None:
    parser.add_argument("--split", type=Literal["test", "val"], default="test", help="the split to evaluate")


def evaluate(job: RunJob) -> dict[str, Any]:
    """Evaluate ``--split`` and write ``eval-<ckpt>-<split>.json``.

    Returns:
        ``acc``, ``loss`` (fractions / mean cross-entropy), ``per_class_acc`` ({class: fraction, or null for a
        class without images in the split}),
        ``confusion_matrix`` (rows: true class), ``samples``, ``split``, ``ckpt``, ``precision``.
    """
    cli, data, split = job.cli, job.cli.datamodule, job.options.split
    if split == "val":
        metrics = cli.trainer.validate(cli.model, datamodule=data, verbose=False)[0]
        confusion = cli.model.val_confusion
    else:
        metrics = cli.trainer.test(cli.model, datamodule=data, verbose=False)[0]
        confusion = cli.model.test_confusion
    classes = data.classes
    out = {
        "acc": metrics[f"{split}/acc"],
        "loss": metrics[f"{split}/loss"],
        "per_class_acc": dict(zip(classes, class_accuracies(confusion), strict=True)),
        "confusion_matrix": confusion.tolist(),
        "samples": int(confusion.sum()),
        "split": split,
        "ckpt": str(job.ckpt.resolve()),
        "precision": cli.trainer.precision,
    }
    if cli.trainer.is_global_zero:
        path = files.write_json(job.run / layout.EVAL.format(ckpt=job.ckpt_name, split=split), out)
        print(f"{split} acc {out['acc']:.4f}  loss {out['loss']:.4f}  ({out['samples']} samples) -> {path}")
    return out


COMMAND = Command("evaluate", "Evaluate a run's checkpoint on its test or validation split.", add_arguments, evaluate)
main = main_of(COMMAND)

if __name__ == "__main__":
    exit_with(cast("Callable[[], int]", main))  # main_of's type leaves out that argv defaults to None
