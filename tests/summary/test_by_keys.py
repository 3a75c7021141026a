"""``summarize --by lr`` groups by the learning rate a run trained with: the optimizer's ``lr``, or ``OneCycleLR``'s
``max_lr`` in runs it schedules (the tuned configs leave the optimizer's ``lr`` at its class default)."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import yaml

from project import summarize


def lr_run(logs: Path, version: int, acc: float, lr: float | None, max_lr: float | None) -> None:
    """A finished run folder as ``fit`` leaves it: Adam at ``lr`` (its default 0.001 where None), under
    ``OneCycleLR`` at ``max_lr`` where given."""
    run = logs / "exp" / f"version_{version}"
    run.mkdir(parents=True)
    model: dict = {"net": "lenet", "optimizer": {"class_path": "torch.optim.Adam", "init_args": {"lr": lr or 0.001}}}
    if max_lr is not None:
        sched = {"class_path": "torch.optim.lr_scheduler.OneCycleLR", "init_args": {"max_lr": max_lr}}
        model["lr_scheduler"] = sched
    config = {"seed_everything": version, "model": model, "data": {"class_path": "project.data.MNISTDataModule"}}
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    (run / "results.json").write_text(json.dumps({"test_acc": acc, "seed": version, "epochs": 1}))


def test_by_lr_is_the_rate_that_rules_each_run(tmp_path, capsys):
    logs = tmp_path / "logs"
    lr_run(logs, 0, 0.80, None, 0.02)
    lr_run(logs, 1, 0.82, None, 0.02)
    lr_run(logs, 2, 0.70, None, 0.005)
    lr_run(logs, 3, 0.60, 0.05, None)  # no scheduler: the optimizer's own lr
    assert summarize.main([str(logs), "--by", "lr", "--format", "csv", "--no_plots"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert sorted((r["group"], r["n"]) for r in rows) == [("lr=0.0050", "1"), ("lr=0.0200", "2"), ("lr=0.0500", "1")]


def test_the_full_key_is_taken_as_written(tmp_path, capsys):
    """``--by model.optimizer.lr`` groups by what the configs hold, the optimizer's own (unused) default."""
    logs = tmp_path / "logs"
    lr_run(logs, 0, 0.80, None, 0.02)
    lr_run(logs, 1, 0.70, None, 0.005)
    assert summarize.main([str(logs), "--by", "model.optimizer.lr", "--format", "csv", "--no_plots"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [(r["group"], r["n"]) for r in rows] == [("model.optimizer.lr=0.0010", "2")]
