"""``python -m benchmarks.recipe_loop`` (the tutorial loop) and ``python -m benchmarks.bench_e2e`` (it against fit)."""

from __future__ import annotations

import json

import pytest
from helpers import REPO

from benchmarks import bench_e2e, recipe_loop
from project.data.modules import FashionMNISTDataModule, MNISTDataModule


def result_line(out: str) -> dict:
    (line,) = [line for line in out.splitlines() if line.startswith("RESULT ")]
    return json.loads(line.removeprefix("RESULT "))


def error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("error:")]


def test_recipe_loop_normalizes_like_the_data_modules():
    for name, dm in (("mnist", MNISTDataModule), ("fashion_mnist", FashionMNISTDataModule)):
        cls, mean, std = recipe_loop.DATASETS[name]
        assert issubclass(dm.dataset_cls, cls) and (mean, std) == (dm.mean, dm.std)  # the data module's reads raw only


def test_recipe_loop_trains_on_tiny_mnist(tiny_mnist, capsys):
    MNISTDataModule(data_dir=str(tiny_mnist["data"]), source_dir=str(tiny_mnist["source"])).prepare_data()
    args = ["--dataset", "mnist", "--data_dir", str(tiny_mnist["data"]), "--epochs", "2", "--print_every", "5"]
    assert recipe_loop.main(args) == 0
    out = capsys.readouterr().out
    r = result_line(out)
    assert r["test_acc"] > 0.1  # chance; the tiny set has a learnable stripe per class
    assert r["epochs"] == 2 and r["steps"] == 2 * 10  # 600 images in batches of 64
    assert r["test_samples"] == 100 and r["train_time_s"] > 0
    assert "[2,    10] loss:" in out  # the tutorial's running-loss line


def test_recipe_loop_limits_batches_per_epoch(tiny_mnist, capsys):
    MNISTDataModule(data_dir=str(tiny_mnist["data"]), source_dir=str(tiny_mnist["source"])).prepare_data()
    args = ["--data_dir", str(tiny_mnist["data"]), "--epochs", "2", "--limit_train_batches", "3"]
    assert recipe_loop.main(args) == 0
    assert result_line(capsys.readouterr().out)["steps"] == 6


def test_recipe_loop_missing_data_is_one_error_line(tmp_path, capsys):
    assert recipe_loop.main(["--dataset", "fashion_mnist", "--data_dir", str(tmp_path / "none")]) != 0
    captured = capsys.readouterr()
    (err,) = error_lines(captured.err)
    assert "FashionMNIST/raw/train-images-idx3-ubyte not found" in err
    assert "RESULT" not in captured.out


def test_bench_e2e_failed_command_is_one_error_line(tiny_mnist, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    args = [
        "--config",
        str(REPO / "configs/mnist.yaml"),
        "--data_dir",
        str(tiny_mnist["data"]),
        "--source_dir",
        str(tiny_mnist["source"]),
        "--repeats",
        "1",
        "--raw_args",
        "--lr -1",
    ]
    assert bench_e2e.main(args) == 1
    (err,) = error_lines(capsys.readouterr().err)
    assert "raw loop (run 1/1" in err and "failed (exit 2)" in err and "--lr must be > 0, got -1.0" in err
    assert not (tmp_path / "bench_e2e.json").exists()


def test_bench_e2e_rejects_a_cifar_config(tmp_path, capsys):
    assert bench_e2e.main(["--config", str(REPO / "configs/cifar10.yaml"), "--data_dir", str(tmp_path)]) == 1
    (err,) = error_lines(capsys.readouterr().err)
    assert "CIFAR10DataModule" in err and "recipe B" in err


# fit's side kept short: 2 validation batches, no sanity check, 10 test batches (the raw loop tests on all 10,000)
FIT_ARGS = (
    "--trainer.limit_val_batches 2 --trainer.num_sanity_val_steps 0 --trainer.limit_test_batches 10 "
    "--data.num_workers 0"
)


def test_bench_e2e_on_real_fashion_mnist(fashion_source, tmp_path, monkeypatch, capsys):
    """One short run of each command on the real data: both rows measured, accuracies read back, files written."""
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "bench" / "e2e.json"
    args = [
        "--config",
        str(REPO / "configs/fashion_mnist.yaml"),
        "--source_dir",
        str(fashion_source),
        "--data_dir",
        str(tmp_path / "data"),
        "--repeats",
        "1",
        "--epochs",
        "1",
        "--limit_train_batches",
        "20",
        "--fit_args",
        FIT_ARGS,
        "--out",
        str(out),
    ]
    assert bench_e2e.main(args) == 0
    assert (tmp_path / "data/FashionMNIST/raw/t10k-labels-idx1-ubyte").is_file()
    report = json.loads(out.read_text())
    raw, fit = report["rows"]
    assert (raw["row"], fit["row"]) == ("raw loop", "fit")
    assert "--limit_train_batches 20" in raw["command"] and "--dataset fashion_mnist" in raw["command"]
    assert fit["command"].endswith(f".limit_train_batches 20 {FIT_ARGS}")
    for row in (raw, fit):
        assert row["wall_s"] > 0 and row["walls_s"] == [row["wall_s"]]
        assert 0 < row["startup_s"] < row["wall_s"] and 0 < row["train_s"] < row["wall_s"] and row["rest_s"] > 0
        assert len(row["test_accs"]) == 1 and row["test_acc"] == row["test_accs"][0]
        # 20 steps: SGD-momentum reaches about 0.55, fit's AdamW one-cycle about 0.66 (chance is 0.1)
        assert row["test_acc"] > 0.2
    assert raw["ratio"] == 1.0
    assert report["ratio"] == fit["ratio"] == pytest.approx(fit["wall_s"] / raw["wall_s"])
    assert "1 epoch(s)" in report["header"] and "1 repeat(s)" in report["header"]
    assert bench_e2e.machine() in report["header"] and "torch " in report["header"]
    md = out.with_suffix(".md").read_text()
    assert md.startswith(report["header"]) and md.count("\n| raw loop |") == 1 and md.count("\n| fit |") == 1
    assert md in capsys.readouterr().out
    assert not list(tmp_path.glob("logs")) and not list(tmp_path.glob("lightning_logs"))
