"""``python -m project.predict RUN INPUT... [--ckpt best] [--out preds.csv] [--top_k 3]``.

Classifies image files (PNG, JPEG, BMP, GIF, WebP; any size and mode) or folders of them (searched
recursively, sorted) with a run's checkpoint. Each image is preprocessed exactly like the run's test data:
converted to the data's mode (grayscale ``L`` for MNIST/Fashion-MNIST, ``RGB`` for CIFAR-10), resized to its
H x W (bilinear) and passed through the data module's own evaluation transform (``ToTensor`` +
``Normalize``). Writes a CSV: ``path``, ``pred`` (class index), ``label`` (class name), ``prob``, then
``top<i>_label`` / ``top<i>_prob`` for i = 1..top_k.

Images are input from elsewhere: a file that is not an image, is truncated, or declares more than
``MAX_PIXELS`` pixels (a "decompression bomb") gets one ``error:`` line naming it and is skipped; the others
are still classified, and the exit status is 1.
"""

from __future__ import annotations

import csv
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

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


def predict(job: Job) -> list[dict[str, Any]]:
    """Classify every readable input with ``Trainer.predict`` (the module's ``predict_step``, the data module's
    ``predict_dataloader``); write the CSV; return its rows.

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
    rows: list[dict[str, Any]] = []
    if len(images):
        probs = torch.cat(job.cli.trainer.predict(model, datamodule=data))
        top = torch.topk(probs, k, dim=1)
        for path, values, indices in zip(images.files, top.values.tolist(), top.indices.tolist()):
            row: dict[str, Any] = {"path": str(path), "pred": indices[0], "label": classes[indices[0]],
                                   "prob": round(values[0], 6)}  # fmt: skip
            for i in range(k):
                row[f"top{i + 1}_label"] = classes[indices[i]]
                row[f"top{i + 1}_prob"] = round(values[i], 6)
            rows.append(row)
        job.out.parent.mkdir(parents=True, exist_ok=True)
        with open(job.out, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    failed = len(images.refused)
    print(f"{len(rows)} image(s) classified -> {job.out}" + (f"; {failed} refused" if failed else ""))
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
