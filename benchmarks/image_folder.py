"""``python -m benchmarks.image_folder``: your own images at full size -- Fashion-MNIST as 70,000 PNG files against
its IDX archives, the same machine, side by side::

    python -m benchmarks.image_folder --source_dir /usr/share/datasets/fashion-mnist --work /tmp/png-bench --seeds 3

1. The archives are imported into ``WORK/idx`` (``FashionMNISTDataModule.prepare_data``) and their 60,000 training and
   10,000 test images written out as PNG files, ``WORK/png/{train,test}/<class>/<n>.png``, as a person would save them
   (not part of the comparison; its seconds are printed).
2. The folder data module's first run, from no cache: listing and decoding every file into the uint8 cache
   (``prepare_data`` + ``setup``, seconds), then a second data module reading that cache.
3. ``python -m project.fit --config configs/fashion_mnist.yaml`` on each path, the archives (``FashionMNISTDataModule``)
   and the folder (``ImageFolderDataModule``, ``channels 1``, ``image_size 28``, the same 5,000 validation images'
   count), alternately, for each seed of ``--seeds`` (1, 2, ...; the seed of the weights and shuffling and of the
   validation split, ``data.seed``, so the spread is the one a user sees between runs): each run's ``epoch_time_s``
   (training steps with data loading, per epoch, from ``results.json``) and test accuracy; the table gives the median
   first epoch, the median of the later epochs, and the accuracy as mean ± std (population std) over the seeds.

Writes ``WORK/image_folder.json`` and prints a Markdown table. ``--fit_args`` adds arguments to both fits (one string);
``--limit N`` writes only the first N images of each split and ``--val_size`` sets both paths' validation images (a
quick check, as the test does).
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

from PIL import Image

REPO = Path(__file__).resolve().parents[1]


def write_pngs(idx: Path, png: Path, limit: int | None = None) -> float:
    """Write every image of the imported archives under ``idx`` (the first ``limit`` of each split, when given) as a
    PNG file under ``png``; returns seconds."""
    from project.data import FashionMNISTDataModule

    start = time.perf_counter()
    dm = FashionMNISTDataModule(data_dir=str(idx))
    dm.setup("fit")
    for split, ds in (("train", dm.train_set), ("test", dm.test_set)):
        for i, (image, label) in enumerate(zip(ds.data[:limit].numpy(), ds.targets[:limit].tolist())):
            folder = png / split / f"class{label}"  # Fashion-MNIST's own names hold a "/" (T-shirt/top)
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(image).save(folder / f"{i:05d}.png")
    return time.perf_counter() - start


def decode_times(png: Path, val_size: int) -> tuple[float, float]:
    """Seconds of the folder data module's first run (no cache: list and decode every file) and of a second run
    (read the cache), each ``prepare_data`` + ``setup("fit")``."""
    import shutil

    from project.data import ImageFolderDataModule

    shutil.rmtree(png / ".cache", ignore_errors=True)  # the first run decodes (the files may be in the OS cache)
    times = []
    for _ in range(2):
        start = time.perf_counter()
        dm = ImageFolderDataModule(data_dir=str(png), channels=1, image_size=28, val_size=val_size)
        dm.prepare_data()
        dm.setup("fit")
        times.append(time.perf_counter() - start)
    return times[0], times[1]


def fit(data: list[str], logs: Path, seed: int, extra: list[str]) -> dict:
    """One ``fit`` of configs/fashion_mnist.yaml on ``data``; returns its results.json."""
    args = [
        *("--config", str(REPO / "configs/fashion_mnist.yaml"), *data, "--seed_everything", str(seed)),
        *("--data.seed", str(seed)),
        *("--trainer.logger.init_args.save_dir", str(logs), "--trainer.enable_progress_bar", "false", *extra),
    ]
    proc = subprocess.run([sys.executable, "-m", "project.fit", *args], capture_output=True, text=True, cwd=REPO)
    if proc.returncode != 0:
        sys.exit(f"error: fit {' '.join(data)} failed: {proc.stderr.strip().splitlines()[-1:]}")
    newest = max(logs.rglob("results.json"), key=lambda p: p.stat().st_mtime)
    return json.loads(newest.read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.image_folder", description=__doc__.splitlines()[0])
    parser.add_argument("--source_dir", required=True, help="folder holding the Fashion-MNIST .gz archives")
    parser.add_argument("--work", required=True, help="folder for the PNG files, the imported archives and the runs")
    parser.add_argument("--seeds", type=int, default=3, help="fits per path (seeds 1..N)")
    parser.add_argument("--fit_args", default="", help="more arguments for both fits, as one string")
    parser.add_argument("--val_size", type=int, default=5000, help="validation images of both paths")
    parser.add_argument("--limit", type=int, default=None, help="write only the first N images of each split")
    args = parser.parse_args(argv)
    from project.data import FashionMNISTDataModule

    work = Path(args.work)
    idx, png = work / "idx", work / "png"
    FashionMNISTDataModule(data_dir=str(idx), source_dir=args.source_dir).prepare_data()
    write_s = write_pngs(idx, png, args.limit) if not (png / "test").is_dir() else None
    first_s, cached_s = decode_times(png, args.val_size)
    paths = {
        "IDX archives": ["--data.data_dir", str(idx), "--data.val_size", str(args.val_size)],
        "PNG folder": [
            *("--data", "project.data.ImageFolderDataModule", "--data.data_dir", str(png)),
            *("--data.channels", "1", "--data.image_size", "28", "--data.val_size", str(args.val_size)),
        ],
    }
    runs: dict[str, list[dict]] = {name: [] for name in paths}
    for seed in range(1, args.seeds + 1):
        for name, data in paths.items():
            runs[name].append(fit(data, work / "logs" / name.split()[0].lower(), seed, shlex.split(args.fit_args)))
    rows = {}
    for name, results in runs.items():
        accs = [r["test_acc"] for r in results]
        rows[name] = {
            "first_epoch_s": statistics.median(r["epoch_time_s"][0] for r in results),
            "epoch_time_s": statistics.median(t for r in results for t in r["epoch_time_s"][1:]),
            "test_acc_mean": statistics.fmean(accs),
            "test_acc_std": statistics.pstdev(accs),
            "test_acc": accs,
            "precision": results[0]["precision"],
        }
    out = {"write_pngs_s": write_s, "first_run_decode_s": first_s, "cached_run_s": cached_s, "fits": rows}
    (work / "image_folder.json").write_text(json.dumps(out, indent=2))
    idx_time = rows["IDX archives"]["epoch_time_s"]
    print(f"PNG files written in {write_s:.1f} s" if write_s is not None else "PNG files already there")
    print(f"folder data module: first run (decode every file) {first_s:.1f} s, next run (cache) {cached_s:.2f} s\n")
    print("| path | first epoch s | later epochs s (median) | × IDX | test acc (mean ± std) | each run | precision |")
    print("|---|---|---|---|---|---|---|")
    for name, row in rows.items():
        each = ", ".join(f"{a:.4f}" for a in row["test_acc"])
        print(
            f"| {name} | {row['first_epoch_s']:.2f} | {row['epoch_time_s']:.2f} | {row['epoch_time_s'] / idx_time:.2f} "
            f"| {row['test_acc_mean']:.4f} ± {row['test_acc_std']:.4f} | {each} | {row['precision']} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
