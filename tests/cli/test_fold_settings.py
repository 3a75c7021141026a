"""K-fold runs through ``python -m project.fit``: every bad ``data.folds``/``data.fold`` setting is one ``error:``
line with nothing written; a fold run records its fold in ``config.yaml``, ``results.json`` and HPARAMS, and a
resume keeps its folds (and refuses other ones)."""

from __future__ import annotations

import json

import pytest
import torch
import yaml
from helpers import results, run_dirs, run_main, tensorboard_hparams, tiny_args

from project.data.modules import MNISTDataModule


def fold_args(paths, logs, *extra, name="tiny"):
    """tiny_args without its ``--data.val_size`` (folds choose the validation images)."""
    args = tiny_args(paths, logs, *extra, name=name)
    i = args.index("--data.val_size")
    return args[:i] + args[i + 2 :]


def error_lines(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]


REFUSED = [
    (["--data.folds", "3", "--data.fold", "3"], "data.fold: 3 is not one of the 3 folds; use 0 to 2"),
    (["--data.folds", "1"], "data.folds: 1 is not a cross-validation; use 2 or more folds"),
    (["--data.fold", "2"], "data.fold: 2 without data.folds"),
    (["--data.folds", "100"], "data.folds: 100 folds but class"),  # the tiny set has ~60 images a class
    (["--data.folds", "3", "--data.val_size", "100"], "data.val_size: 100 with data.folds: 3"),
    # the archive sets' default, written out, is a value too: refused, not silently replaced by a fold
    (["--data.folds", "3", "--data.val_size", "5000"], "data.val_size: 5000 with data.folds: 3"),
]


@pytest.mark.parametrize(("extra", "expected"), REFUSED, ids=[" ".join(r[0]) for r in REFUSED])
def test_bad_fold_settings_are_one_error_and_leave_nothing(extra, expected, tiny_mnist, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    logs = tmp_path / "logs"
    assert run_main(fold_args(tiny_mnist, logs, *extra)) == 2
    errors = error_lines(capsys)
    assert len(errors) == 1 and expected in errors[0], errors
    assert run_dirs(logs) == []


@pytest.mark.slow
def test_a_fold_run_records_its_fold_and_resumes_on_the_same_folds(tiny_mnist, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    logs = tmp_path / "logs"
    args = fold_args(tiny_mnist, logs, "--data.folds", "4", "--data.fold", "1", "--seed_everything", "3")
    assert run_main(args) == 0
    (run,) = run_dirs(logs)
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert (config["data"]["init_args"]["folds"], config["data"]["init_args"]["fold"]) == (4, 1)
    assert config["seed_everything"] == 3  # the folds' seed (linked to data.seed)
    res = results(run)
    assert (res["folds"], res["fold"]) == (4, 1)
    hp = tensorboard_hparams(run)
    assert (hp["folds"], hp["fold"]) == (4, 1)
    ckpt = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    saved = ckpt["datamodule_hyper_parameters"]
    assert (saved["folds"], saved["fold"], saved["seed"]) == (4, 1, 3)
    # the data a resume rebuilds from the checkpoint validates on the same 150 images as a fresh fold 1 of 4
    resumed = MNISTDataModule(**{k: v for k, v in saved.items() if not k.startswith("_")})
    resumed.setup("fit")
    fresh = MNISTDataModule(data_dir=str(tiny_mnist["data"]), folds=4, fold=1, seed=3)
    fresh.setup("fit")
    assert len(resumed.split[1]) == 150 and all(torch.equal(a, b) for a, b in zip(resumed.split, fresh.split))

    # a resume on another fold is refused before anything is written; on the same folds it continues the run
    before = sorted(p.name for p in run.rglob("*"))
    other = [*args, "--data.fold", "2", "--ckpt_path", "last", "--trainer.max_epochs", "2"]
    capsys.readouterr()
    assert run_main(other) == 2
    (err,) = error_lines(capsys)
    assert "data.fold 1 -> 2" in err and "validating on other images" in err
    assert sorted(p.name for p in run.rglob("*")) == before
    assert run_main([*args, "--ckpt_path", "last", "--trainer.max_epochs", "2"]) == 0
    assert run_dirs(logs) == [run]
    assert (results(run)["epochs"], results(run)["fold"]) == (2, 1)


def test_a_plain_run_records_no_fold(trained_run):
    res = results(trained_run)
    assert res["folds"] is None and res["fold"] is None
    hp = tensorboard_hparams(trained_run)
    assert hp["fold"] == -1 and not hp["folds"]


@pytest.mark.slow
def test_the_recipes_retrain_uses_every_training_image_and_tests_once(tiny_mnist, tmp_path, monkeypatch):
    """docs/kfold.md's last step: no validation split (``data.val_size 0``, ``trainer.limit_val_batches 0``), so
    all 600 training images train, and the final weights are tested."""
    monkeypatch.chdir(tmp_path)
    logs = tmp_path / "logs"
    args = fold_args(tiny_mnist, logs, "--data.val_size", "0", "--trainer.limit_val_batches", "0")
    assert run_main(args) == 0
    (run,) = run_dirs(logs)
    res = results(run)
    assert res["global_step"] == 12 and res["test_samples"] == 100  # 600 / 50 batches; the whole test set
    assert res["best_val_acc"] is None and res["folds"] is None and res["test_ckpt"] == "final weights"


def test_a_fold_run_written_before_val_size_defaulted_to_unset_still_evaluates(tiny_mnist, tmp_path, monkeypatch):
    """Earlier versions wrote ``data.val_size: 5000`` (the then default) into every fold run's config.yaml, where
    any val_size is now refused: the run-folder commands read that 5000 as the unset it was, and evaluate the fold."""
    from project import evaluate

    monkeypatch.chdir(tmp_path)
    assert run_main(fold_args(tiny_mnist, tmp_path / "logs", "--data.folds", "4", "--data.fold", "1")) == 0
    (run,) = run_dirs(tmp_path / "logs")
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert config["data"]["init_args"]["val_size"] is None  # what this version writes
    config["data"]["init_args"]["val_size"] = 5000
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    assert evaluate.main([str(run), "--data.data_dir", str(tiny_mnist["data"]), "--split", "val"]) == 0
    out = json.loads((run / "eval-best-val.json").read_text())
    assert out["samples"] == 150 and out["acc"] == pytest.approx(results(run)["best_val_acc"], abs=1e-7)
