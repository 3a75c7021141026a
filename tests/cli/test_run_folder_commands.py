"""The run-folder commands share fit's parser (issue: one CLI): their own options are typed keys of the same
jsonargparse parser as every override, so ``--help`` shows both and a bad value is one line naming the key."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
from helpers import own_data, results, run_dirs, run_main, tiny_args

from project import evaluate, export, predict

COMMANDS = {"evaluate": evaluate, "predict": predict, "export": export}
COMMAND_NAMES = ("fit", "evaluate", "predict", "export", "summarize", "sweep")
OWN_OPTIONS = {"evaluate": ["--split"], "predict": ["--top_k", "--out", "inputs"], "export": ["--format", "--atol"]}


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_help_lists_the_commands_options_and_fits_overrides(name, trained_run, capsys):
    with pytest.raises(SystemExit) as info:
        COMMANDS[name].main([str(trained_run), "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: python -m project.{name} RUN")
    for option in [*OWN_OPTIONS[name], "--ckpt", "--trust_checkpoint", "--model.net", "--trainer.accelerator"]:
        assert option in out, option


@pytest.mark.parametrize(
    "name, argv, key",
    [
        ("evaluate", ["--split", "train"], "split"),
        ("predict", ["x.png", "--top_k", "0"], "top_k"),
        ("export", ["--atol", "-1"], "atol"),
        ("export", ["--repeats", "0"], "repeats"),
        ("export", ["--format", "tflite"], "format"),
        ("evaluate", ["--data.batch_size", "-3"], "data.batch_size"),
    ],
)
def test_a_bad_option_value_is_one_line_naming_its_key(name, argv, key, trained_run, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    before = sorted(p.name for p in trained_run.iterdir())
    assert COMMANDS[name].main([str(trained_run), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {key}"), err
    assert sorted(p.name for p in trained_run.iterdir()) == before


@pytest.mark.slow
def test_evaluate_val_reproduces_the_best_checkpoints_validation_accuracy(tiny_mnist, tmp_path, monkeypatch):
    """``--split val`` runs Lightning's ``Trainer.validate`` on the split fit held out: the best checkpoint scores
    exactly the ``val/acc`` it was chosen by."""
    monkeypatch.chdir(tmp_path)
    assert run_main(tiny_args(tiny_mnist, tmp_path / "logs", "--trainer.max_epochs", "2")) == 0
    (run,) = run_dirs(tmp_path / "logs")
    assert evaluate.main([str(run), *own_data(run), "--split", "val"]) == 0
    out = json.loads((run / "eval-best-val.json").read_text())
    assert out["split"] == "val" and out["samples"] == 100  # data.val_size
    assert out["acc"] == pytest.approx(results(run)["best_val_acc"], abs=1e-7)
    confusion = out["confusion_matrix"]
    assert sum(confusion[i][i] for i in range(10)) == round(out["acc"] * 100)


def run_python(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_python_m_project_runs_each_command_as_its_own_module(trained_run, tmp_path):
    listing = run_python("-m", "project", "--help", cwd=tmp_path)
    assert listing.returncode == 0
    assert [line.split()[0] for line in listing.stdout.splitlines()[2:]] == list(COMMAND_NAMES)
    for argv in ([], ["nope"]):
        wrong = run_python("-m", "project", *argv, cwd=tmp_path)
        assert wrong.returncode == 2 and wrong.stderr.count("\n") == 1 and wrong.stderr.startswith("error: ")
    # the same command through both entries: the same output files and exit status
    for entry, out in ((["-m", "project", "summarize"], "a"), (["-m", "project.summarize"], "b")):
        done = run_python(*entry, str(trained_run.parent), "--out", str(tmp_path / out), cwd=tmp_path)
        assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == sorted(p.name for p in (tmp_path / "b").iterdir())
    assert (tmp_path / "a" / "summary.csv").read_text() == (tmp_path / "b" / "summary.csv").read_text()
    bad = run_python("-m", "project", "evaluate", str(trained_run), "--split", "train", cwd=tmp_path)
    assert bad.returncode == 2 and bad.stderr.strip().splitlines()[-1].startswith("error: split")


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_run_must_come_first_and_is_required(name, trained_run, capsys):
    for argv in (["--ckpt", "last", str(trained_run)], []):
        assert COMMANDS[name].main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: ") and ("RUN comes first" in err[0] or "run" in err[0])


def test_accuracy_is_the_fraction_of_images_classified_right_on_each_split(
    trained_run, tiny_mnist, tmp_path, monkeypatch
):
    """``val/acc`` and ``test/acc`` are micro accuracies (torchmetrics ``MulticlassAccuracy(average="micro")``):
    images classified right / images, as each split's confusion matrix counts them, not a mean over classes; fit's
    ``best_val_acc`` is evaluate's ``--split val`` on the best checkpoint."""
    run = tmp_path / "logs" / "tiny" / "version_0"
    shutil.copytree(trained_run, run)
    monkeypatch.chdir(tmp_path)
    r = results(run)
    test_cm = np.array(r["confusion_matrix"])
    assert r["test_acc"] == pytest.approx(np.trace(test_cm) / test_cm.sum(), abs=1e-6)
    assert evaluate.main([str(run), *own_data(run), "--split", "val"]) == 0
    out = json.loads((run / "eval-best-val.json").read_text())
    val_cm = np.array(out["confusion_matrix"])
    assert out["samples"] == val_cm.sum() == 100
    assert out["acc"] == pytest.approx(np.trace(val_cm) / val_cm.sum(), abs=1e-6)
    assert out["acc"] == pytest.approx(r["best_val_acc"], abs=1e-6)
