"""``summarize`` over K-fold runs: runs differing only in ``data.fold`` (and the seed) form one group with mean ± std,
``data.folds`` still tells groups apart, and the CSVs hold the values fold by fold."""

from __future__ import annotations

import csv
import io
import json
import statistics
from pathlib import Path

import pytest
import yaml

from project import summarize


def fold_run(logs: Path, version: int, acc: float, seed: int, fold: int | None, folds: int | None = 3) -> Path:
    """A finished run folder as ``fit`` leaves it for ``summarize`` (``config.yaml``, ``results.json``)."""
    run = logs / "exp" / f"version_{version}"
    run.mkdir(parents=True)
    data = {"batch_size": 50, "val_size": 5000} | ({"folds": folds, "fold": fold} if folds is not None else {})
    config = {
        "seed_everything": seed,
        "model": {"net": "lenet"},
        "data": {"class_path": "project.data.MNISTDataModule", "init_args": data},
    }
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    results = {"test_acc": acc, "best_val_acc": acc - 0.01, "seed": seed, "epochs": 1, "sparsity": 0.0}
    results |= {"folds": folds, "fold": fold if folds is not None else None}
    (run / "results.json").write_text(json.dumps(results))
    return run


def test_runs_differing_in_fold_and_seed_are_one_group_with_per_fold_values(tmp_path, capsys):
    logs = tmp_path / "logs"
    accs = {(seed, fold): 0.80 + fold / 100 + seed / 1000 for seed in (1, 2) for fold in range(3)}
    for version, ((seed, fold), acc) in enumerate(accs.items()):
        fold_run(logs, version, acc, seed, fold)
    fold_run(logs, 6, 0.70, 1, 0, folds=5)  # another number of folds: another group
    fold_run(logs, 7, 0.60, 1, None, folds=None)  # a plain run
    capsys.readouterr()
    assert summarize.main([str(logs), "--no_plots"]) == 0
    table = capsys.readouterr().out
    groups = json.loads((logs / "summary.json").read_text())["groups"]
    assert sorted(groups) == ["exp [data.folds=-]", "exp [data.folds=3]", "exp [data.folds=5]"]
    three = groups["exp [data.folds=3]"]
    assert three["runs"] == 6 and three["test_acc"]["n"] == 6
    assert three["test_acc"]["mean"] == pytest.approx(statistics.fmean(accs.values()))
    assert three["test_acc"]["std"] == pytest.approx(statistics.stdev(accs.values()))
    # fold by fold: the mean over the two seeds
    assert sorted(three["folds"]) == ["0", "1", "2"]  # JSON keys
    for fold in range(3):
        assert three["folds"][str(fold)]["n"] == 2
        assert three["folds"][str(fold)]["test_acc"] == pytest.approx((accs[(1, fold)] + accs[(2, fold)]) / 2)
    assert "folds" not in groups["exp [data.folds=-]"]

    rows = {r["group"]: r for r in csv.DictReader(io.StringIO((logs / "summary.csv").read_text()))}
    assert rows["exp [data.folds=3]"]["n"] == "6"
    for fold in range(3):
        expected = (accs[(1, fold)] + accs[(2, fold)]) / 2
        assert float(rows["exp [data.folds=3]"][f"test_acc_fold{fold}"]) == pytest.approx(expected)
    assert float(rows["exp [data.folds=5]"]["test_acc_fold0"]) == pytest.approx(0.70)
    assert rows["exp [data.folds=5]"]["test_acc_fold1"] == "" and rows["exp [data.folds=-]"]["test_acc_fold0"] == ""

    runs = list(csv.DictReader(io.StringIO((logs / "summary-runs.csv").read_text())))
    assert [r["fold"] for r in runs] == ["0", "1", "2", "0", "1", "2", "0", ""]
    assert "| run | group | status | seed | fold | test_acc |" in table
    assert "| exp/version_4 | exp [data.folds=3] | finished | 2 | 1 | 0.8120 |" in table


def test_without_fold_runs_the_tables_keep_their_columns(tmp_path, capsys):
    logs = tmp_path / "logs"
    for version, seed in enumerate((1, 2)):
        fold_run(logs, version, 0.5 + seed / 10, seed, None, folds=None)
    assert summarize.main([str(logs), "--no_plots"]) == 0
    assert "| run | group | status | seed | test_acc |" in capsys.readouterr().out
    header = (logs / "summary.csv").read_text().splitlines()[0]
    assert "fold" not in header and "fold" not in (logs / "summary-runs.csv").read_text().splitlines()[0]
