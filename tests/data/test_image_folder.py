"""ImageFolderDataModule: your own images in train/<class>/ folders, on small generated folders, in process."""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from helpers import run_dirs, run_main
from PIL import Image
from tiny_data import make_image_folder

from project import evaluate, predict
from project.data import FashionMNISTDataModule, ImageFolderDataModule
from project.data import folders as folders_mod
from project.data.images import load_images
from project.errors import ConfigError, DataError

CLASSES = ["cat", "dog", "frog"]


def fit_args(data: Path, logs: Path, *extra: str) -> list[str]:
    return [
        *("--config", str(Path(__file__).parents[2] / "configs" / "image_folder.yaml")),
        *("--data.data_dir", str(data), "--data.batch_size", "16"),
        *("--trainer.max_epochs", "3", "--trainer.enable_progress_bar", "false"),
        *("--trainer.enable_model_summary", "false", "--trainer.logger.init_args.save_dir", str(logs)),
        *extra,
    ]


def test_the_folder_gives_exactly_the_archives_images_and_labels(fashion_data, tmp_path):
    """A slice of the real Fashion-MNIST archives (600 training, 200 test images) written out as PNG folders (one per
    class, as a person would save them) gives the same uint8 images and labels through the folder data module as
    through the archive data module."""
    archive = FashionMNISTDataModule(data_dir=str(fashion_data))
    archive.setup("fit")
    names = [f"class{k}" for k in range(10)]  # Fashion-MNIST's own names hold a "/" (T-shirt/top)
    sliced = {"train": archive.train_set, "test": archive.test_set}
    sliced = {
        split: (ds.data[:n].numpy(), ds.targets[:n].tolist()) for (split, ds), n in zip(sliced.items(), (600, 200))
    }
    for split, (images, labels) in sliced.items():
        for i, (image, label) in enumerate(zip(images, labels)):
            folder = tmp_path / "png" / split / names[label]
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(image).save(folder / f"{i:05d}.png")
    dm = ImageFolderDataModule(data_dir=str(tmp_path / "png"), channels=1, image_size=28, val_size=0)
    dm.prepare_data()
    dm.setup("fit")
    assert dm.classes == sorted({names[t] for t in sliced["train"][1]})
    for split, (images, labels) in sliced.items():
        ours = dm.train_set if split == "train" else dm.test_set
        want = sorted((names[t], img.tobytes()) for img, t in zip(images, labels))
        got = sorted((dm.classes[t], img.tobytes()) for img, t in zip(ours.data, ours.targets))
        assert len(got) == len(want) and got == want, split


def test_fit_sizes_the_net_from_the_classes_and_records_them(tmp_path, monkeypatch):
    """Three class folders: SimpleCNN gets three outputs; the classes are in config.yaml, the checkpoint and
    results.json's confusion matrix size; accuracy is above chance; the test step reads test/."""
    monkeypatch.chdir(tmp_path)
    data = make_image_folder(tmp_path / "images")
    assert run_main(fit_args(data, tmp_path / "logs")) == 0
    (run,) = run_dirs(tmp_path / "logs")
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert config["data"]["init_args"]["classes"] == CLASSES
    result = json.loads((run / "results.json").read_text())
    assert result["params"] == 32 * 32 * 32 * 3 + 3 + 448 + 4640  # conv 3->16, conv 16->32, Linear(32*32*32 -> 3)
    assert np.array(result["confusion_matrix"]).shape == (3, 3)
    assert result["test_samples"] == 3 * 10 and result["test_acc"] > 0.5
    state = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["ImageFolderDataModule"]
    assert state["classes"] == CLASSES and len(state["mean"]) == len(state["std"]) == 3


def test_predict_needs_no_image_folder_and_uses_the_checkpoints_statistics(tmp_path, monkeypatch):
    """The run's classes come from its config.yaml and the normalization from its checkpoint: predict on a machine
    without the training images labels test images by class name, as well as the run's test step did."""
    monkeypatch.chdir(tmp_path)
    data = make_image_folder(tmp_path / "images")
    assert run_main(fit_args(data, tmp_path / "logs")) == 0
    (run,) = run_dirs(tmp_path / "logs")
    moved = tmp_path / "elsewhere"
    os.rename(data, moved)
    out = tmp_path / "preds.csv"
    assert predict.main([str(run), str(moved / "test"), "--out", str(out)]) == 0
    rows = list(csv.DictReader(out.open()))
    right = sum(row["label"] == Path(row["path"]).parent.name for row in rows)
    assert len(rows) == 30 and right / len(rows) >= json.loads((run / "results.json").read_text())["test_acc"] - 1e-9
    assert {row["label"] for row in rows} <= set(CLASSES)
    # evaluate reads the folder the user names, and reproduces the test accuracy
    assert evaluate.main([str(run), "--data.data_dir", str(moved)]) == 0
    evaluated = json.loads((run / "eval-best-test.json").read_text())
    assert evaluated["acc"] == pytest.approx(json.loads((run / "results.json").read_text())["test_acc"])


def test_statistics_come_from_the_training_split_only(tmp_path):
    """mean/std are those of the train/ images left after the validation split, per channel; a checkpoint's travel
    back through load_state_dict."""
    data = make_image_folder(tmp_path / "images", splits=("train", "val", "test"))
    dm = ImageFolderDataModule(data_dir=str(data))
    dm.setup("fit")
    assert len(dm.split[0]) == 120 and len(dm.split[1]) == 30  # val/ validates: nothing split off train/
    train = torch.from_numpy(dm.train_set.data[:120]).double() / 255
    assert dm.mean == pytest.approx(train.mean(dim=(0, 1, 2)).tolist())
    assert dm.std == pytest.approx(train.std(dim=(0, 1, 2), correction=0).tolist())
    other = ImageFolderDataModule(data_dir=str(data))
    other.load_state_dict(dm.state_dict())
    assert other.mean == dm.mean and other.std == dm.std
    with pytest.raises(DataError, match="classes"):
        other.load_state_dict({**dm.state_dict(), "classes": ["a", "b", "c"]})
    with pytest.raises(ConfigError, match="folds"):
        ImageFolderDataModule(data_dir=str(data), folds=3).setup("fit")


def test_without_val_a_tenth_of_train_validates_and_folds_split_train(tmp_path):
    data = make_image_folder(tmp_path / "images", splits=("train",))
    dm = ImageFolderDataModule(data_dir=str(data))
    dm.setup("fit")
    assert (len(dm.split[0]), len(dm.split[1])) == (108, 12)
    assert len(dm.test_set) == 12  # no test/: the validation images
    folds = ImageFolderDataModule(data_dir=str(data), folds=3, fold=1)
    folds.setup("fit")
    assert (len(folds.split[0]), len(folds.split[1])) == (80, 40)


def test_the_cache_is_read_on_the_next_run_and_rebuilt_when_a_file_changes(tmp_path, monkeypatch):
    data = make_image_folder(tmp_path / "images")
    ImageFolderDataModule(data_dir=str(data)).prepare_data()
    (cache,) = (data / ".cache").iterdir()

    decoded = []

    def counted(paths, *args, **kwargs):
        paths = list(paths)
        decoded.extend(paths)
        return load_images(paths, *args, **kwargs)

    with monkeypatch.context() as mp:
        mp.setattr(folders_mod, "load_images", counted)
        dm = ImageFolderDataModule(data_dir=str(data))
        dm.setup("fit")
        assert len(dm.train_set) == 120
    # only the spot check's sample of each split is decoded again, all different files
    sizes = [len(list((data / split).rglob("*.png"))) for split in ("train", "val", "test")]
    assert len(decoded) == len(set(decoded)) == sum(min(folders_mod.CACHE_SPOT_CHECKS, n) for n in sizes if n)
    # a changed image: a new key, decoded again, with the new pixels
    changed = data / "train" / "cat" / "0000.png"
    Image.new("RGB", (40, 30), (255, 255, 255)).save(changed)
    dm = ImageFolderDataModule(data_dir=str(data))
    dm.setup("fit")
    assert len(list((data / ".cache").iterdir())) == 2
    assert (dm.train_set.data == 255).all(axis=(1, 2, 3)).sum() == 1
    # a cache file that does not load is rebuilt, not trusted
    for path in (data / ".cache").iterdir():
        path.write_bytes(b"not a cache")
    dm = ImageFolderDataModule(data_dir=str(data))
    dm.setup("fit")
    assert len(dm.train_set) == 120


@pytest.mark.parametrize(
    ("resize", "corner"),
    [("stretch", 255), ("crop", 255), ("pad", 0)],
)
def test_resize_policies(resize, corner, tmp_path):
    """A white 40x20 picture: stretched or cropped it fills the 32x32 square; padded, the corners are black."""
    data = make_image_folder(tmp_path / "images", per_class=4, splits=("train",))
    wide = data / "train" / "cat" / "wide.png"
    Image.new("RGB", (40, 20), (255, 255, 255)).save(wide)
    dm = ImageFolderDataModule(data_dir=str(data), resize=resize)
    dm.setup("fit")
    index = [i for i, t in enumerate(dm.train_set.targets) if t == 0][-1]  # wide.png sorts after the digits
    image = dm.train_set.data[index]
    assert image.shape == (32, 32, 3)
    assert image[0, 0, 0] == corner and image[16, 16, 0] == 255


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda d: os.rename(d / "train", d / "training"), "train is missing"),
        (lambda d: [p.unlink() for p in (d / "train" / "dog").iterdir()], "dog: no image files"),
        (lambda d: (d / "test" / "horse").mkdir(), r"\['horse'\] are not in train/"),
        (lambda d: (d / "train" / "cat" / "0001.png").write_bytes(b"\x89PNG\r\n\x1a\n broken"), "0001.png"),
        (lambda d: [shutil.rmtree(d / "test"), (d / "test").mkdir()], "test: no class folders"),
        (lambda d: (d / "val").mkdir(), "val: no class folders"),
    ],
    ids=["no-train", "empty-class", "unknown-test-class", "corrupt-image", "empty-test", "empty-val"],
)
def test_bad_folders_are_one_error_line_and_write_no_run(damage, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    data = make_image_folder(tmp_path / "images", per_class=8)
    damage(data)
    assert run_main(fit_args(data, tmp_path / "logs")) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:"), err
    assert re.search(message, err[0]), err
    assert not (tmp_path / "logs").exists() or not run_dirs(tmp_path / "logs")


def test_one_class_and_other_files(tmp_path):
    data = make_image_folder(tmp_path / "images", classes=("only",), per_class=4, splits=("train",))
    with pytest.raises(DataError, match="at least two"):
        ImageFolderDataModule(data_dir=str(data))
    data = make_image_folder(tmp_path / "more", per_class=4, splits=("train",))
    (data / "train" / "cat" / "notes.txt").write_text("not an image")
    dm = ImageFolderDataModule(data_dir=str(data))
    dm.setup("fit")
    assert len(dm.train_set) == 12 and dm.skipped == 1


def test_val_size_0_trains_on_all_of_train_and_needs_a_test_folder(tmp_path):
    """docs/kfold.md's last step (retrain on every image: --data.val_size 0) on an image folder."""
    data = make_image_folder(tmp_path / "images")
    dm = ImageFolderDataModule(data_dir=str(data), val_size=0)
    dm.setup("fit")
    assert (len(dm.split[0]), len(dm.split[1]), len(dm.test_set)) == (120, 0, 30)
    shutil.rmtree(data / "test")
    with pytest.raises(ConfigError, match="no images to test on"):
        ImageFolderDataModule(data_dir=str(data), val_size=0).setup("fit")


def test_hidden_entries_and_linked_folders_inside_a_class_are_skipped_and_counted(tmp_path):
    data = make_image_folder(tmp_path / "images", per_class=4, splits=("train",))
    cat = data / "train" / "cat"
    (cat / ".thumbs").mkdir()
    Image.new("RGB", (8, 8)).save(cat / ".thumbs" / "square.png")  # a thumbnail cache, not a cat
    Image.new("RGB", (8, 8)).save(cat / ".hidden.png")
    (cat / "notes.txt").write_text("not an image")
    (cat / "more").symlink_to(data / "train" / "dog", target_is_directory=True)  # a link can point anywhere
    (cat / "loop").symlink_to(cat, target_is_directory=True)
    files, skipped = folders_mod.class_files(cat)
    assert [p.name for p in files] == [f"0{i:03d}.png" for i in range(4)] and skipped == 5
    dm = ImageFolderDataModule(data_dir=str(data))
    dm.setup("fit")
    assert len(dm.train_set) == 12 and dm.skipped == 5


@pytest.mark.parametrize(
    "plant",
    [
        lambda train: train[:, :16, :16],  # same length, 16x16 images
        lambda train: 255 - train,  # the right shape, other pixels: a cache planted in a folder from elsewhere
    ],
    ids=["other-shape", "other-pixels"],
)
def test_a_cache_under_the_right_key_is_rebuilt_unless_its_pixels_are_the_images(plant, tmp_path):
    data = make_image_folder(tmp_path / "images", per_class=4, splits=("train",))
    ImageFolderDataModule(data_dir=str(data)).prepare_data()
    (cache,) = (data / ".cache").iterdir()
    payload = torch.load(cache, weights_only=True)
    right = payload["train"].numpy().copy()
    payload["train"] = plant(payload["train"])
    torch.save(payload, cache)
    dm = ImageFolderDataModule(data_dir=str(data))
    dm.setup("fit")
    assert np.array_equal(dm.train_set.data, right)
    assert np.array_equal(torch.load(cache, weights_only=True)["train"].numpy(), right)  # and rewritten


def test_only_the_most_recent_caches_are_kept(tmp_path):
    data = make_image_folder(tmp_path / "images", per_class=4, splits=("train",))
    for size in (8, 12, 16, 20, 24):
        ImageFolderDataModule(data_dir=str(data), image_size=size).prepare_data()
    assert len(list((data / ".cache").glob("images-*.pt"))) == folders_mod.CACHES_KEPT


def test_a_data_shape_no_net_takes_names_the_data_settings(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    data = make_image_folder(tmp_path / "images", per_class=4)
    assert run_main(fit_args(data, tmp_path / "logs", "--data.channels", "1")) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "no net takes 1x32x32" in line and "data.channels" in line and "lenet 1x28x28" in line, line


VAL_SIZES = [
    ([], 12),  # unset: a tenth of the 120 train/ images, recorded as a number
    (["--data.val_size", "30"], 30),
    # the archive sets' default written out is taken as written (it was once read as "unset")
    (
        ["--data.val_size", "5000"],
        r"data.val_size: 5000 must be smaller than the 120 images of train/; set --data.val_size below 120, or drop "
        r"it for a tenth \(12\)",
    ),
    (["--data.val_size", "10", "--val"], "data.val_size: 10 with .*/val, which is the validation set"),
]


CASES = [
    (*case, switched) for case in VAL_SIZES for switched in (False, True) if not switched or case in VAL_SIZES[::2]
]


@pytest.mark.parametrize(
    ("extra", "want", "switched"),
    CASES,
    ids=[
        f"{c[0][1] if c[0] else 'unset'}{'-val' if '--val' in c[0] else ''}{'-switched' if c[2] else ''}" for c in CASES
    ],
)
def test_a_val_size_as_written_takes_effect_or_is_refused(extra, want, switched, tmp_path, monkeypatch, capsys):
    """``data.val_size`` on an image folder, from its own config or with ``--data`` switching the class from the
    default MNIST (jsonargparse then carries MNIST's settings over): a number is taken as written or refused with
    one ``error:`` line; unset is a tenth of train/, and config.yaml records the number that ran."""
    monkeypatch.chdir(tmp_path)
    splits = ("train", "val", "test") if "--val" in extra else ("train", "test")
    data = make_image_folder(tmp_path / "images", splits=splits)
    extra = [a for a in extra if a != "--val"]
    args = fit_args(data, tmp_path / "logs", "--trainer.max_epochs", "1", *extra)
    if switched:
        args = [*args[2:], "--data", "project.data.ImageFolderDataModule", "--data.data_dir", str(data)]
        args += ["--model.net", "lenet", "--data.channels", "1", "--data.image_size", "28", *extra]
    code = run_main(args)
    if isinstance(want, str):
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and re.search(want, err[0]), err
        assert not (tmp_path / "logs").exists() or not run_dirs(tmp_path / "logs")
        return
    assert code == 0
    (run,) = run_dirs(tmp_path / "logs")
    assert yaml.safe_load((run / "config.yaml").read_text())["data"]["init_args"]["val_size"] == want
    ckpt = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["datamodule_hyper_parameters"]["val_size"] == want
