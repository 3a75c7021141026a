"""``python -m project.predict RUN INPUT... [--ckpt best] [--out preds.csv] [--top_k 3]``.

Classifies image files (PNG, JPEG, BMP, GIF, WebP; any size and mode) or folders of them (searched
recursively, sorted) with a run's checkpoint. Each image is read as a person sees it, whatever its mode
(:func:`project.data.images.as_seen`): EXIF orientation applied; 16-bit images scaled 0..65535 -> 0..255 (not
clipped); float (``F``) images taken as 0.0..1.0; transparent pixels composited over white; palette, 1-bit and
CMYK converted. It is then preprocessed exactly like the run's test data: converted to the data's mode (grayscale
``L`` for MNIST/Fashion-MNIST, ``RGB`` for CIFAR-10), resized to its H x W (bilinear) and passed through the data
module's own evaluation transform (``ToTensor`` + ``Normalize``). Writes a CSV: ``path``, ``pred`` (class index),
``label`` (class name), ``prob``, then ``top<i>_label`` / ``top<i>_prob`` for i = 1..top_k; rows are written as
batches are classified (through an exclusive temporary file renamed at the end, never through a link), and files
are read one at a time, so any number of inputs takes bounded memory and open files.

Images are input from elsewhere: a file that is not an image, is truncated, declares more than ``MAX_PIXELS``
pixels (a "decompression bomb") or takes more than ``DECODE_TIMEOUT_S`` seconds to decode (in a helper process,
:mod:`project.decode`) gets one ``error:`` line naming it and is skipped; the others are still classified, and the
exit status is 1.
"""

from __future__ import annotations

import csv
import io
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import torch
from jsonargparse.typing import PositiveInt
from lightning.pytorch.callbacks import BasePredictionWriter
from lightning.pytorch.cli import LightningArgumentParser

from project.cli.commands import Command, RunJob, main_of
from project.cli.entry import exit_with
from project.data.images import image_files
from project.errors import ConfigError, UserError
from project.runs import files


def add_arguments(parser: LightningArgumentParser) -> None:
    parser.add_argument("inputs", nargs="+", type=str, help="image files or folders")
    parser.add_argument("--out", type=str, default="preds.csv", help="CSV to write (default preds.csv)")
    parser.add_argument("--top_k", type=PositiveInt, default=3, help="classes per image in the CSV (default 3)")


class CsvRows(BasePredictionWriter):
    """Lightning's prediction writer: one CSV row per image, written as each batch is classified.

    Args:
        writer: a ``csv.DictWriter`` whose header is written.
        files: the dataset's files (``batch_indices`` index them).
        classes: class names by index.
        k: classes per row.
    """

    def __init__(self, writer: csv.DictWriter, files: list[Path], classes: list[str], k: int) -> None:
        super().__init__("batch")
        self.writer, self.files, self.classes, self.k = writer, files, classes, k
        self.rows = 0

    def write_on_batch_end(
        self,
        trainer: Any,
        pl_module: Any,
        prediction: torch.Tensor,
        batch_indices: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int,
    ) -> None:
        top = torch.topk(prediction, self.k, dim=1)
        for i, values, indices in zip(batch_indices, top.values.tolist(), top.indices.tolist()):
            row: dict[str, Any] = {
                "path": str(self.files[i]),
                "pred": indices[0],
                "label": self.classes[indices[0]],
                "prob": round(values[0], 6),
            }
            for j in range(self.k):
                row[f"top{j + 1}_label"] = self.classes[indices[j]]
                row[f"top{j + 1}_prob"] = round(values[j], 6)
            self.writer.writerow(row)
            self.rows += 1


def predict(job: RunJob) -> int:
    """Classify every readable input with ``Trainer.predict`` (the module's ``predict_step``, the data module's
    ``predict_dataloader``), writing the CSV as it goes (:class:`CsvRows`); return the number of rows.

    Raises:
        ConfigError: ``trainer.limit_predict_batches`` is set (it would leave inputs out), or the command line asks
            for more than one process (``--trainer.devices 2``); nothing is written.
        UserError: some inputs could not be read (after the others were classified and written; exit 1).
    """
    model, data, options = job.cli.model, job.cli.datamodule, job.options
    if job.cli.trainer.world_size > 1:  # each process would write its share of the inputs into the same CSV
        raise ConfigError(
            f"trainer.devices/num_nodes: {job.cli.trainer.world_size} processes; predict runs as one process (the "
            "default), drop --trainer.devices, --trainer.num_nodes and --trainer.strategy"
        )
    out = Path(options.out)
    if out.is_dir():
        raise ConfigError(f"--out {options.out!r} is a folder; give a file name")
    files.check_folder(out.parent, "--out", keep=True)  # writable, before anything is classified
    image_files(options.inputs)  # a missing input is a usage error, before anything is classified
    limit = job.cli.trainer.limit_predict_batches
    if not (limit is None or (isinstance(limit, float) and limit == 1.0)):  # 0 crashed; others dropped images
        raise ConfigError(f"trainer.limit_predict_batches: {limit!r}; predict classifies every input, leave it unset")
    images = data.predict_on(options.inputs)
    for _, reason in images.refused:
        print(f"error: {reason}", file=sys.stderr)
    classes = data.classes
    k = min(options.top_k, len(classes))
    rows = 0
    if len(images):
        fields = ["path", "pred", "label", "prob"] + [f"top{i}_{x}" for i in range(1, k + 1) for x in ("label", "prob")]
        # whole or not at all, never through a planted link (project.runs.files.atomic_file)
        try:
            with files.atomic_file(out) as raw:
                f = io.TextIOWrapper(raw, newline="", write_through=True)
                writer = csv.DictWriter(f, fieldnames=fields)
                writer.writeheader()
                rows_out = CsvRows(writer, images.files, classes, k)
                # Trainer.callbacks: set by Lightning's CallbackConnector, not declared on the class
                job.cli.trainer.callbacks.append(rows_out)  # type: ignore[attr-defined]
                job.cli.trainer.predict(model, datamodule=data, return_predictions=False)
                f.detach()  # the CSV is written through; atomic_file closes the file itself
        except OSError as e:
            raise UserError(f"--out {out}: cannot write it ({e.strerror or e}); choose another file") from None
        rows = rows_out.rows
    failed = len(images.refused)
    print(f"{rows} image(s) classified -> {out}" + (f"; {failed} refused" if failed else ""))
    if failed:
        raise UserError(f"{failed} of {failed + len(images)} inputs could not be read (see the lines above)")
    return rows


COMMAND = Command(
    "predict",
    "Classify image files with a run's checkpoint into a CSV.",
    add_arguments,
    predict,
    overrides=("--trainer.accelerator", "cpu"),
    positionals="RUN INPUT [INPUT ...]",
)
main = main_of(COMMAND)


if __name__ == "__main__":
    exit_with(cast("Callable[[], int]", main))  # main_of's type leaves out that argv defaults to None
