"""K-fold sweeps (``folds: K`` in a sweep file): every fold of every point is a trial, the report scores a point by
the mean over its folds, the pruner compares a fold with the same fold; bad fold settings are one error line."""

from __future__ import annotations

import json
import statistics

import optuna
import pytest
import yaml
from helpers import REPO, SMOKE, run_sweep, study_of, write_sweep

from project.sweep import config as sweep_config
from project.sweep import file as sweep_file
from project.sweep import study as sweep_study
from project.sweep.trial import SameFoldStudy

LR = "model.optimizer.init_args.lr"


def kfold_sweep(tmp_path, **changes):
    """The smoke sweep without its ``--data.val_size`` (folds choose the validation images), with ``changes``."""
    args = yaml.safe_load(SMOKE.read_text())["base"]["args"]
    i = args.index("--data.val_size")
    base = {"args": args[:i] + args[i + 2 :]}
    return write_sweep(tmp_path, name="kfold", base=base, **changes)


def test_each_point_runs_every_fold_of_every_seed(tmp_path):
    spec = sweep_file.load_sweep(kfold_sweep(tmp_path, folds=3))
    assert spec.points() == [
        {LR: lr, "seed": s, "fold": k} for s in (1, 2) for lr in (0.01, 0.05) for k in range(3)
    ]  # a point's folds one after the other: its cross-validation is complete early
    assert spec.total() == 12 and spec.repeats() == [{"seed": s, "fold": k} for s in (1, 2) for k in range(3)]
    assert spec.identity()["folds"] == 3
    assert "folds" not in sweep_file.load_sweep(SMOKE).identity()  # studies made before folds existed continue
    shipped = sweep_file.load_sweep(REPO / "configs/sweeps/kfold.yaml")  # the documented example
    assert (shipped.folds, shipped.total()) == (5, 15)
    assert shipped.points()[:5] == [
        {"model.lr_scheduler.init_args.max_lr": 0.005, "seed": 42, "fold": k} for k in range(5)
    ]


def test_a_trial_config_sets_its_fold():
    base = {
        "data": {"class_path": "project.data.FashionMNISTDataModule", "init_args": {"batch_size": 50}},
        "trainer": {"logger": {"class_path": "project.report.RunTensorBoardLogger", "init_args": {}}},
    }
    config = sweep_config.trial_config(base, {}, 1, "logs", "kfold", 4, (2, 5))
    assert config["data"]["init_args"] == {"batch_size": 50, "fold": 2, "folds": 5}
    assert "fold" not in sweep_config.trial_config(base, {}, 1, "logs", "kfold", 4)["data"]["init_args"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"folds": 1}, "folds: 1 is not a cross-validation; give 2 or more folds"),
        ({"folds": 0}, "folds: 0 is not a number of folds >= 2, or null"),
        ({"folds": 3, "space": {"data.init_args.fold": [0, 1]}}, "space.data.init_args.fold: give the number of folds"),
        ({"folds": 3, "pruner": "hyperband"}, "pruner: hyperband compares trials in brackets of its own"),
        ({"folds": 3, "base": None}, "base: data.val_size: 1000 with data.folds: 3"),
    ],
)
def test_bad_fold_settings_are_one_error_line_and_write_nothing(change, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    if change.get("base", 0) is None:  # the smoke base, which sets data.val_size
        change = {k: v for k, v in change.items() if k != "base"}
        path = write_sweep(tmp_path, name="kfold", **change)
    else:
        path = kfold_sweep(tmp_path, **change)
    assert sweep_study.main(["--config", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kfold.yaml"]


def test_the_pruner_compares_a_fold_with_the_same_fold():
    """Fold 1 is hard (low val/acc everywhere): a fold-1 trial at 0.5 is pruned against all trials (median 0.8)
    but not against the other fold-1 trials (median 0.425)."""
    storage = optuna.storages.InMemoryStorage()
    study = optuna.create_study(storage=storage, study_name="kfold", direction="maximize")
    fold = optuna.distributions.CategoricalDistribution([0, 1])
    for k, value in ((0, 0.9), (0, 0.85), (0, 0.8), (1, 0.4), (1, 0.45)):
        study.add_trial(
            optuna.trial.create_trial(
                params={"fold": k}, distributions={"fold": fold}, value=value, intermediate_values={0: value}
            )
        )
    study.enqueue_trial({"fold": 1})
    trial = study.ask({"fold": fold})
    trial_id = storage.get_trial_id_from_study_id_trial_number(storage.get_study_id_from_name("kfold"), trial.number)
    pruner = optuna.pruners.MedianPruner(n_startup_trials=1, n_warmup_steps=0)
    same = optuna.Trial(SameFoldStudy("kfold", storage, trial.params["fold"], pruner), trial_id)
    every = optuna.Trial(SameFoldStudy("kfold", storage, None, pruner), trial_id)
    same.report(0.5, step=0)
    assert [t.params["fold"] for t in same.study.get_trials(deepcopy=False)] == [1, 1, 1]
    assert len(every.study.get_trials(deepcopy=False)) == 6
    assert not same.should_prune() and every.should_prune()
    assert same.study.best_trial.value == 0.45 and every.study.best_trial.value == 0.9


@pytest.mark.slow
def test_a_3_fold_smoke_sweep_of_an_own_net_on_fashion_mnist_reports_mean_and_std_over_folds(fashion_data, tmp_path):
    """One point, its 3 folds, of the user's own net (``helpers.OwnNet``, from a package outside the project, on the
    trials' command line): each trial trains that net on its fold."""
    spec = kfold_sweep(tmp_path, folds=3, seeds=[1], space={LR: [0.05]})  # one point: its 3 folds
    args = ["--config", str(spec), "--data.data_dir", str(fashion_data), "--model.net", "helpers.OwnNet"]
    proc = run_sweep(args, tmp_path, PYTHONPATH=str(REPO / "tests"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    folder = tmp_path / "logs" / "kfold"
    study = study_of("kfold", f"sqlite:///{folder / 'study.db'}")
    done = study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    assert sorted((t.params[LR], t.params["fold"]) for t in done) == [(0.05, k) for k in range(3)]
    report = json.loads((folder / "report.json").read_text())
    assert len(report["points"]) == 1
    for point in report["points"]:
        lr = point["params"][LR]
        values = {t.params["fold"]: t.value for t in done if t.params[LR] == lr}
        assert point["n"] == 3 and point["seeds"] == [1]
        assert {int(k): v for k, v in point["folds"].items()} == pytest.approx(values)
        assert point["mean"] == pytest.approx(statistics.fmean(values.values()))
        assert point["std"] == pytest.approx(statistics.stdev(values.values()))
    for t in done:  # each trial trained and validated on its own fold of 60,000 / 3
        run = folder / f"version_{t.number}"
        results = json.loads((run / "results.json").read_text())
        assert (results["folds"], results["fold"]) == (3, t.params["fold"])
        info = json.loads((run / "trial.json").read_text())
        assert info["fold"] == t.params["fold"]
        config = yaml.safe_load((run / "config.yaml").read_text())
        assert (config["data"]["init_args"]["folds"], config["data"]["init_args"]["fold"]) == (3, t.params["fold"])
        assert config["model"]["net"]["class_path"] == "helpers.OwnNet" and results["params"] == 72 + 8 + 1290
    best = max(report["points"], key=lambda p: p["mean"])
    text = (folder / "report.md").read_text()
    assert f"best_val_acc {best['mean']:.4f} ± {best['std']:.4f} over 3 fold(s) x 1 seed(s)" in text
    assert "Folds (best_val_acc, each fold's mean over seeds):" in text
