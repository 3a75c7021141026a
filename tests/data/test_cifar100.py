"""CIFAR-100 through the offline import, and class names for CIFAR runs without the data set."""

from __future__ import annotations

import csv

import pytest
from helpers import results, run_dirs, run_main
from PIL import Image

from project import predict
from project.data import CIFAR10DataModule, CIFAR100DataModule
from project.data.modules import CIFAR10_CLASSES, CIFAR100_CLASSES


def cifar_args(paths: dict, logs, data: str, *extra: str) -> list[str]:
    return [
        *("--data", data, "--data.data_dir", str(paths["data"]), "--data.source_dir", str(paths["source"])),
        *("--data.val_size", "50", "--data.batch_size", "50", "--model.net", "simple_cnn"),
        *(
            "--model.optimizer",
            "torch.optim.SGD",
            "--trainer.max_epochs",
            "1",
            "--trainer.enable_progress_bar",
            "false",
        ),
        *("--trainer.enable_model_summary", "false", "--trainer.logger.init_args.save_dir", str(logs)),
        *("--trainer.logger.init_args.log_graph", "false"),
        *extra,
    ]


def test_cifar100_imports_offline_with_100_fine_labels(tiny_cifar100):
    dm = CIFAR100DataModule(
        data_dir=str(tiny_cifar100["data"]), source_dir=str(tiny_cifar100["source"]), val_size=50, batch_size=50
    )
    dm.prepare_data()
    dm.setup("fit")
    assert (tiny_cifar100["data"] / "cifar-100-python" / "train").is_file()
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (50, 3, 32, 32) and y.dtype.is_floating_point is False and int(y.max()) < 100
    assert len(dm.split[0]) == 250 and len(dm.test_set) == 100
    assert dm.num_classes == 100 and dm.classes == sorted(dm.classes) and len(set(dm.classes)) == 100


@pytest.mark.slow  # 10-25 s: SimpleCNN with 100 classes holds 3.3 M parameters
def test_simple_cnn_gets_100_outputs_and_predict_names_the_classes(tiny_cifar100, tmp_path, monkeypatch):
    """A CIFAR-100 fit through the CLI: the net's last layer is Linear(32*32*32 -> 100); predict, with no data set
    on disk, writes the published fine label names."""
    monkeypatch.chdir(tmp_path)
    limits = ("--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "1")
    assert run_main(cifar_args(tiny_cifar100, tmp_path / "logs", "project.data.CIFAR100DataModule", *limits)) == 0
    (run,) = run_dirs(tmp_path / "logs")
    assert results(run)["params"] == 448 + 4640 + 32 * 32 * 32 * 100 + 100
    assert len(results(run)["confusion_matrix"]) == 100
    Image.new("RGB", (32, 32), (200, 10, 10)).save(tmp_path / "red.png")
    assert predict.main([str(run), str(tmp_path / "red.png"), "--out", str(tmp_path / "p.csv")]) == 0
    (row,) = csv.DictReader((tmp_path / "p.csv").open())
    assert row["label"] == CIFAR100_CLASSES[int(row["pred"])] and row["top3_label"] in CIFAR100_CLASSES


def test_cifar10_names_its_classes_without_the_data_set(tmp_path):
    """predict on a CIFAR-10 run read the class names from torchvision's class, which holds them only after loading
    the data: an AttributeError. They are the published batches.meta names."""
    assert CIFAR10DataModule(data_dir=str(tmp_path)).classes == list(CIFAR10_CLASSES)
    assert CIFAR10_CLASSES[:3] == ("airplane", "automobile", "bird") and len(CIFAR10_CLASSES) == 10
