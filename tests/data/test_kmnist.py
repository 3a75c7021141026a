"""KMNIST through the offline import: archives kept and checked against, statistics from the training split."""

from __future__ import annotations

import csv
import gzip
import json
import shutil

import numpy as np
import pytest
import torch
from helpers import results, run_dirs, run_main
from PIL import Image
from tiny_data import make_tiny_kmnist

from project import evaluate, predict
from project.data import KMNISTDataModule
from project.errors import DataError

HIRAGANA = ["o", "ki", "su", "tsu", "na", "ha", "ma", "ya", "re", "wo"]


@pytest.fixture
def tiny_kmnist(tmp_path, monkeypatch):
    return make_tiny_kmnist(tmp_path / "kmnist", monkeypatch)


def test_kmnist_trains_with_its_training_splits_own_statistics_carried_to_predict(tiny_kmnist, tmp_path, monkeypatch):
    """A KMNIST fit through the CLI from the original archives: LeNet above chance; the checkpoint carries the
    training split's own per-pixel mean and std (computed here independently, in NumPy), which evaluate and
    predict use, predict with no data set on disk, naming the classes in hiragana romaji."""
    monkeypatch.chdir(tmp_path)
    args = [
        *("--data", "project.data.KMNISTDataModule", "--data.data_dir", str(tiny_kmnist["data"])),
        *("--data.source_dir", str(tiny_kmnist["source"]), "--data.val_size", "100", "--data.batch_size", "50"),
        *("--model.optimizer", "torch.optim.Adam", "--model.optimizer.lr", "0.01", "--trainer.max_epochs", "2"),
        *("--trainer.enable_progress_bar", "false", "--trainer.logger.init_args.save_dir", str(tmp_path / "logs")),
        *("--trainer.logger.init_args.log_graph", "false"),
    ]
    assert run_main(args) == 0
    (run,) = run_dirs(tmp_path / "logs")
    raw = tiny_kmnist["data"] / "KMNIST" / "raw"
    assert sorted(p.name for p in raw.glob("*.gz")) == sorted(p.name for p in tiny_kmnist["source"].iterdir())
    assert results(run)["test_acc"] > 0.3  # chance: 0.1

    dm = KMNISTDataModule(data_dir=str(tiny_kmnist["data"]), val_size=100)
    dm.setup("fit")
    pixels = dm.train_set.data.numpy()[dm.split[0].numpy()].astype(np.float64) / 255
    state = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["KMNISTDataModule"]
    assert state["mean"] == pytest.approx([pixels.mean()], abs=1e-12)
    assert state["std"] == pytest.approx([pixels.std()], abs=1e-12) and state["std"] != [0.5]
    assert list(dm.mean) == pytest.approx(state["mean"])

    assert evaluate.main([str(run), "--data.data_dir", str(tiny_kmnist["data"])]) == 0
    evaluated = json.loads((run / "eval-best-test.json").read_text())
    assert evaluated["acc"] == pytest.approx(results(run)["test_acc"], abs=1e-6)

    shutil.rmtree(tiny_kmnist["data"])  # predict needs no data set: the classes and statistics travel with the run
    images = dm.test_set.data[:20].numpy()
    for i, image in enumerate(images):
        Image.fromarray(image).save(tmp_path / f"{i:02d}.png")
    out = tmp_path / "p.csv"
    assert predict.main([str(run), *(str(tmp_path / f"{i:02d}.png") for i in range(20)), "--out", str(out)]) == 0
    rows = list(csv.DictReader(out.open()))
    assert all(row["label"] == HIRAGANA[int(row["pred"])] for row in rows)
    right = sum(int(row["pred"]) == int(dm.test_set.targets[i]) for i, row in enumerate(rows))
    assert right / 20 > 0.3  # predict normalizes as the net was trained: well above chance


def test_a_changed_file_archive_or_recompressed_archive_is_named(tiny_kmnist, tmp_path):
    """KMNIST publishes only its archives' md5: an extracted file changed in place (same size: the IDX size check
    passes), a kept archive changed, and a re-compressed copy offered for import are each one DataError naming
    the file."""
    dm = KMNISTDataModule(data_dir=str(tiny_kmnist["data"]), source_dir=str(tiny_kmnist["source"]), val_size=100)
    dm.prepare_data()
    raw = tiny_kmnist["data"] / "KMNIST" / "raw"
    labels = raw / "train-labels-idx1-ubyte"
    original = labels.read_bytes()
    labels.write_bytes(original[:-1] + bytes([(original[-1] + 1) % 10]))
    with pytest.raises(DataError, match="train-labels-idx1-ubyte is not the content of train-labels-idx1-ubyte.gz"):
        KMNISTDataModule(data_dir=str(tiny_kmnist["data"])).prepare_data()
    labels.write_bytes(original)
    kept = raw / "t10k-images-idx3-ubyte.gz"
    kept.write_bytes(kept.read_bytes() + b"\0")
    with pytest.raises(DataError, match="t10k-images-idx3-ubyte.gz fails its md5 check"):
        KMNISTDataModule(data_dir=str(tiny_kmnist["data"])).prepare_data()

    source = tmp_path / "recompressed"
    shutil.copytree(tiny_kmnist["source"], source)
    archive = source / "train-images-idx3-ubyte.gz"
    archive.write_bytes(gzip.compress(gzip.decompress(archive.read_bytes()), compresslevel=1, mtime=0))
    fresh = KMNISTDataModule(data_dir=str(tmp_path / "fresh"), source_dir=str(source))
    with pytest.raises(DataError, match="only the original archive is accepted"):
        fresh.prepare_data()
    assert not (tmp_path / "fresh").exists()  # nothing half-imported
