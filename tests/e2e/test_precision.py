"""Every precision Lightning's Trainer accepts (issue 34), in each spelling, with Lightning's model summary on: it
trains here and ``results.json`` records the precision used, and ``evaluate`` reproduces the run's test accuracy,
or it is one ``error:`` line with nothing left behind."""

from __future__ import annotations

import json
import typing

import pytest
from helpers import own_data, results, run_dirs, run_main, tiny_args
from lightning.fabric.connector import _PRECISION_INPUT_INT, _PRECISION_INPUT_STR, _PRECISION_INPUT_STR_ALIAS

from project import evaluate

# Lightning's own list of values (its Trainer's ``precision`` type), so that a new one is tried here too
LIGHTNING_PRECISIONS = [
    *typing.get_args(_PRECISION_INPUT_STR),
    *typing.get_args(_PRECISION_INPUT_STR_ALIAS),
    *typing.get_args(_PRECISION_INPUT_INT),
]
# what a CPU trains with: 16-bit mixed precision is bf16 there (one warning line); the rest as asked
USED_ON_CPU = {"16-mixed": "bf16-mixed", "16": "bf16-mixed", "bf16": "bf16-mixed", "32": "32-true", "64": "64-true"}
# needs NVIDIA's Transformer Engine and a GPU: one line naming what is missing
REFUSED_ON_CPU = {"transformer-engine", "transformer-engine-float16"}


@pytest.mark.parametrize(
    "precision",
    [pytest.param(p, marks=() if p == "bf16-true" else pytest.mark.slow) for p in LIGHTNING_PRECISIONS],
    ids=[f"{p!r}" for p in LIGHTNING_PRECISIONS],
)
def test_every_precision_lightning_accepts_trains_and_is_recorded(precision, tiny_mnist, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    logs = tmp_path / "logs"
    limits = ["--trainer.limit_train_batches", "3", "--trainer.limit_val_batches", "1"]
    args = tiny_args(tiny_mnist, logs, "--trainer.precision", str(precision), *limits)
    code = run_main([*args, "--trainer.enable_model_summary", "true"])  # the summary runs the net at fit's start
    if str(precision) in REFUSED_ON_CPU:
        err = [line for line in capsys.readouterr().err.strip().splitlines() if line.startswith("error:")]
        assert code == 2 and len(err) == 1 and "transformer" in err[0].lower(), err
        assert run_dirs(logs) == []
        return
    assert code == 0, capsys.readouterr().err[-2000:]
    (run,) = run_dirs(logs)
    r = results(run)
    assert r["precision"] == USED_ON_CPU.get(str(precision), str(precision))
    assert r["requested_precision"] == str(precision)
    assert evaluate.main([str(run), *own_data(run)]) == 0
    out = json.loads((run / "eval-best-test.json").read_text())
    assert out["acc"] == r["test_acc"] and out["precision"] == r["precision"]
