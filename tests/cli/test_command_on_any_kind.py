"""A run-folder command on a run of any kind (issue 34): whatever precision, ``compile``, pruning, slimming or resume
the run trained with, ``evaluate``, ``predict`` and ``export`` complete, and their output is whole and agrees with
the run (evaluate: the run's own test accuracy on all 100 test images; predict: every input; export: the
exported file matches eager outputs). Strategies, devices and nodes: tests/cli/test_command_on_any_run.py."""

from __future__ import annotations

import csv
import json
import shutil

import numpy as np
import pytest
from helpers import own_data, results, run_dirs, run_main, tiny_args
from PIL import Image
from tiny_data import make_tiny_mnist, train_tiny_run

from project import evaluate, export, predict

COMMANDS = {"evaluate": evaluate, "predict": predict, "export": export}
# how the run trained: fit arguments after tiny_args, or a shared session run
KINDS = {
    "bf16-mixed": ["--trainer.precision", "bf16-mixed"],
    "16-mixed": ["--trainer.precision", "16-mixed"],
    "bf16-true": ["--trainer.precision", "bf16-true"],
    "64-true": ["--trainer.precision", "64-true"],
    "compile": ["--model.compile", "true"],
    "channels_last + in_memory": ["--model.channels_last", "true", "--data.in_memory", "true"],
    "pruned": "pruned_run",
    "slimmed": "slimmed_run",
    "resumed": "resumed",
}
# the runs are short: 2 training steps and 1 validation batch an epoch (the commands use the whole test set)
SHORT = ["--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "1"]
_RUNS: dict[str, object] = {}


def resumed_run(root):
    """1 epoch, then resumed from its last.ckpt to 2 epochs: the run folder of the resumed fit."""
    first, _ = train_tiny_run(root, *SHORT, "--trainer.max_epochs", "1")
    with pytest.MonkeyPatch.context() as mp:
        paths = make_tiny_mnist(root / "again", mp)  # the same seeded archives, patched again for the resume
        mp.chdir(root)
        ckpt = str(first / "checkpoints" / "last.ckpt")
        args = tiny_args(paths, root / "logs", *SHORT, "--trainer.max_epochs", "2", "--ckpt_path", ckpt)
        assert run_main(args) == 0
    (run,) = run_dirs(root / "logs")
    assert results(run)["epochs"] == 2
    return run


@pytest.fixture
def run_of_kind(request, tmp_path_factory, tmp_path):
    """A copy (the commands write into it) of a finished tiny run of the kind ``request.param``."""
    kind = request.param
    if kind not in _RUNS:
        spec = KINDS[kind]
        root = tmp_path_factory.mktemp(kind.replace(" ", "").replace("+", "_"))
        if spec == "resumed":
            _RUNS[kind] = resumed_run(root)
        elif isinstance(spec, str):
            _RUNS[kind] = request.getfixturevalue(spec)
        else:
            _RUNS[kind] = train_tiny_run(root, *SHORT, "--trainer.max_epochs", "1", *spec)[0]
    run = tmp_path / "logs" / "tiny" / "version_0"
    shutil.copytree(_RUNS[kind], run)
    return run


@pytest.mark.slow
@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("run_of_kind", sorted(KINDS), indirect=True)
def test_a_command_on_a_run_of_any_kind_completes_with_whole_output(
    run_of_kind, command, tiny_mnist, tmp_path, monkeypatch
):
    run = run_of_kind
    monkeypatch.chdir(tmp_path)
    images = tmp_path / "images"
    images.mkdir()
    rng = np.random.default_rng(0)
    for i in range(8):
        Image.fromarray(rng.integers(0, 256, (28, 28), dtype=np.uint8), mode="L").save(images / f"{i}.png")
    argv = {
        "evaluate": [str(run), *own_data(run)],
        "predict": [str(run), str(images), "--out", str(tmp_path / "preds.csv")],
        "export": [str(run), *own_data(run), "--format", "pt2", "--repeats", "1"],
    }[command]
    assert COMMANDS[command].main(argv) == 0
    r = results(run)
    if command == "evaluate":
        out = json.loads((run / "eval-best-test.json").read_text())
        assert out["samples"] == 100 and out["acc"] == r["test_acc"]
    elif command == "predict":
        rows = list(csv.DictReader((tmp_path / "preds.csv").open()))
        assert sorted(row["path"].rsplit("/", 1)[-1] for row in rows) == [f"{i}.png" for i in range(8)]
    else:
        record = json.loads((run / "export.json").read_text())["pt2"]
        assert record["max_abs_diff"] <= 1e-4 and record["argmax_agree"] == 1.0
        assert (run / "model-best.pt2").is_file()
