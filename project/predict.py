"""``python -m project.predict RUN INPUT... [--ckpt best] [--out preds.csv] [--top_k 3]``.

Classifies image files (PNG, JPEG, BMP, GIF, WebP; any size and mode) or folders of them (searched
recursively, sorted) with a run's checkpoint. Each image is read as a person sees it, whatever its mode
(:func:`project.data.images.as_seen`): EXIF orientation applied; 16-bit images scaled 0..65535 -> 0..255 (not
clipped); float (``F``) images taken as 0.0..1.0; transparent pixels composited over white; palette, 1-bit and
CMYK converted. It is then preprocessed exactly like the run's test data: converted to the data's mode (grayscale
``L`` for MNIST/Fashion-MNIST, ``RGB`` for CIFAR-10), resized to its H x W (bilinear) and passed through the data
module's own evaluation transform (``ToTensor`` + ``Normalize``). Writes a CSV: ``path``, ``pred`` (class index),
``label`` (class name), ``prob``, then ``top<i>_label`` / ``top<i>_prob`` for i = 1..top_k; rows are written as
batches are classified (through a temporary file renamed at the end), and files are read one at a time, so any
number of inputs takes bounded memory and open files.

Images are input from elsewhere: a file that is not an image, is truncated, or declares more than
``MAX_PIXELS`` pixels (a "decompression bomb") gets one ``error:`` line naming it and is skipped; the others
are still classified, and the exit status is 1.
"""

from __future__ import annotations

import csv
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.callbacks import BasePredictionWriter

from project import runs
from project.cli import ProjectCLI, cli_for_run, exit_with, run_main
from project.data.images import IMAGE_SUFFIXES, MAX_PIXELS, image_files, load_image  # noqa: F401  (public here too)
from project.errors import ArgumentParser, ConfigError, UserError
from project.evaluate import load_weights


@dataclass
class Job:
    cli: ProjectCLI
    inputs: list[str]
    out: Path
    top_k: int


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

    def write_on_batch_end(self, trainer: Any, pl_module: Any, prediction: torch.Tensor, batch_indices: Any,
                           batch: Any, batch_idx: int, dataloader_idx: int) -> None:  # fmt: skip
        top = torch.topk(prediction, self.k, dim=1)
        for i, values, indices in zip(batch_indices, top.values.tolist(), top.indices.tolist()):
            row: dict[str, Any] = {"path": str(self.files[i]), "pred": indices[0], "label": self.classes[indices[0]],
                                   "prob": round(values[0], 6)}  # fmt: skip
            for j in range(self.k):
                row[f"top{j + 1}_label"] = self.classes[indices[j]]
                row[f"top{j + 1}_prob"] = round(values[j], 6)
            self.writer.writerow(row)
            self.rows += 1


def predict(job: Job) -> int:
    """Classify every readable input with ``Trainer.predict`` (the module's ``predict_step``, the data module's
    ``predict_dataloader``), writing the CSV as it goes (:class:`CsvRows`); return the number of rows.

    Raises:
        ConfigError: ``trainer.limit_predict_batches`` is set (it would leave inputs out); nothing is written.
        UserError: some inputs could not be read (after the others were classified and written; exit 1).
    """
    model, data = job.cli.model, job.cli.datamodule
    limit = job.cli.trainer.limit_predict_batches
    if not (limit is None or (isinstance(limit, float) and limit == 1.0)):  # 0 crashed; others dropped images
        raise ConfigError(f"trainer.limit_predict_batches: {limit!r}; predict classifies every input, leave it unset")
    images = data.predict_on(job.inputs)
    for _, reason in images.refused:
        print(f"error: {reason}", file=sys.stderr)
    classes = data.classes
    k = min(job.top_k, len(classes))
    rows = 0
    if len(images):
        fields = ["path", "pred", "label", "prob"] + [f"top{i}_{x}" for i in range(1, k + 1) for x in ("label", "prob")]
        job.out.parent.mkdir(parents=True, exist_ok=True)
        tmp = job.out.with_name(f".{job.out.name}.{os.getpid()}.tmp")
        try:
            with open(tmp, "w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=fields)
                writer.writeheader()
                rows_out = CsvRows(writer, images.files, classes, k)
                job.cli.trainer.callbacks.append(rows_out)
                job.cli.trainer.predict(model, datamodule=data, return_predictions=False)
            rows = rows_out.rows
            os.replace(tmp, job.out)
        finally:
            tmp.unlink(missing_ok=True)
    failed = len(images.refused)
    print(f"{rows} image(s) classified -> {job.out}" + (f"; {failed} refused" if failed else ""))
    if failed:
        raise UserError(f"{failed} of {failed + len(images)} inputs could not be read (see the lines above)")
    return rows


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status (0 ok, 1 some input unreadable, 2 bad arguments/config/checkpoint)."""
    p = ArgumentParser(prog="python -m project.predict", description=__doc__.splitlines()[0],
                                epilog="Other arguments override the run's config, as in python -m project.fit.")
    p.add_argument("run", help="run folder, experiment folder (newest run) or checkpoint inside a run")
    p.add_argument("inputs", nargs="+", metavar="INPUT", help="image files or folders")
    p.add_argument("--ckpt", default="best", help="best (default), last, or a checkpoint file")
    p.add_argument("--out", default="preds.csv", help="CSV to write (default preds.csv)")
    p.add_argument("--top_k", type=int, default=3, help="classes per image in the CSV (default 3)")
    p.add_argument("--trust_checkpoint", action="store_true", help="allow full unpickling (only for files you made)")
    ns, overrides = p.parse_known_args(argv)
    if ns.top_k < 1:
        p.error("--top_k must be >= 1")

    def make() -> Job:
        run, ckpt, _ = runs.command_checkpoint(ns.run, ns.ckpt)
        checkpoint = runs.load_checkpoint(ckpt, trust=ns.trust_checkpoint)  # whole: a slimmed net's widths too
        image_files(ns.inputs)  # a missing input is a usage error, before anything is built
        cli = cli_for_run(run, ["--trainer.accelerator", "cpu", *overrides], "python -m project.predict")
        load_weights(cli, ckpt, checkpoint)
        return Job(cli, ns.inputs, Path(ns.out), ns.top_k)

    return run_main(make, predict)


if __name__ == "__main__":
    exit_with(main)
