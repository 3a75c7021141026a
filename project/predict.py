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

import argparse
import csv
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from PIL import Image, UnidentifiedImageError

from project import runs
from project.cli import ProjectCLI, cli_for_run, run_main
from project.errors import ConfigError, UserError
from project.evaluate import load_weights

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp"}
MAX_PIXELS = 4096 * 4096  # far above any recipe input; refused before decoding


@dataclass
class Job:
    cli: ProjectCLI
    inputs: list[Path]
    out: Path
    top_k: int


def image_files(inputs: list[str]) -> list[Path]:
    """Files named, plus the image files under each folder named (recursive, sorted).

    Raises:
        ConfigError: an input does not exist.
    """
    files: list[Path] = []
    for spec in inputs:
        path = Path(spec)
        if path.is_dir():
            files += sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
        elif path.is_file():
            files.append(path)
        else:
            raise ConfigError(f"{spec} does not exist; give image files or folders of them")
    return files


def load_image(path: Path, mode: str, size: tuple[int, int]) -> Image.Image:
    """Open ``path`` as a ``mode`` image of ``size`` (W, H).

    Raises:
        UserError: not an image, truncated, or more than ``MAX_PIXELS`` pixels.
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(path) as img:
                if img.width * img.height > MAX_PIXELS:
                    raise UserError(f"{path}: {img.width}x{img.height} pixels is more than {MAX_PIXELS}; refused")
                img.load()
                return img.convert(mode).resize(size, Image.Resampling.BILINEAR)
    except UnidentifiedImageError:
        raise UserError(f"{path}: not an image PIL can read") from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise UserError(f"{path}: refused as a decompression bomb ({e})") from None
    except (OSError, SyntaxError, ValueError) as e:
        raise UserError(f"{path}: unreadable image ({e})") from None


def predict(job: Job) -> list[dict[str, Any]]:
    """Classify every readable input; returns the CSV rows. Exits 1 (via :class:`UserError`) if any failed."""
    model, data = job.cli.model.eval(), job.cli.datamodule
    channels, height, width = data.input_shape
    mode = "L" if channels == 1 else "RGB"
    transform = data.eval_transform()
    classes = data.classes
    k = min(job.top_k, len(classes))
    rows, failed = [], []
    for path in job.inputs:
        try:
            x = transform(load_image(path, mode, (width, height))).unsqueeze(0)
        except UserError as e:
            print(f"error: {e}", file=sys.stderr)
            failed.append(path)
            continue
        with torch.no_grad():
            probs = torch.softmax(model(x).float(), dim=1)[0]
        top = torch.topk(probs, k)
        row: dict[str, Any] = {"path": str(path), "pred": int(top.indices[0]), "label": classes[int(top.indices[0])],
                               "prob": round(float(top.values[0]), 6)}  # fmt: skip
        for i in range(k):
            row[f"top{i + 1}_label"] = classes[int(top.indices[i])]
            row[f"top{i + 1}_prob"] = round(float(top.values[i]), 6)
        rows.append(row)
    if rows:
        job.out.parent.mkdir(parents=True, exist_ok=True)
        with open(job.out, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    print(f"{len(rows)} image(s) classified -> {job.out}" + (f"; {len(failed)} refused" if failed else ""))
    if failed:
        raise UserError(f"{len(failed)} of {len(job.inputs)} inputs could not be read (see the lines above)")
    return rows


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status (0 ok, 1 some input unreadable, 2 bad arguments/config/checkpoint)."""
    p = argparse.ArgumentParser(prog="python -m project.predict", description=__doc__.splitlines()[0],
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
        run = runs.find_run(ns.run)
        ckpt = Path(ns.run) if Path(ns.run).suffix == ".ckpt" else runs.checkpoint_arg(run, ns.ckpt)
        state = runs.load_checkpoint(ckpt, trust=ns.trust_checkpoint)
        inputs = image_files(ns.inputs)
        cli = cli_for_run(run, ["--trainer.accelerator", "cpu", *overrides], "python -m project.predict")
        load_weights(cli, ckpt, state)
        return Job(cli, inputs, Path(ns.out), ns.top_k)

    return run_main(make, predict)


if __name__ == "__main__":
    sys.exit(main())
