"""Every trial outcome ends in a known state with one line: a bad trial pruned (also a DDP trial, on all its ranks),
an objective the base experiment never measures (refused up front), one a trial did not produce (failed with one
line), and the trials' warm processes (forked from the worker's trial server) giving the results of the same fit
run alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import optuna
import pytest
from helpers import REPO, pruned_at_once, run_sweep, study_of, tensorboard_hparams, write_sweep

from project.sweep import study as sweep_study

ONE_POINT = {"seeds": [1], "space": {"model.optimizer.init_args.lr": [0.05]}}


@pytest.mark.parametrize(
    ("override", "why"),
    [
        (["--trainer.limit_val_batches", "0"], "trainer.limit_val_batches is 0"),
        (["--trainer.enable_checkpointing", "false"], "trainer.enable_checkpointing is false"),
        (["--trainer.check_val_every_n_epoch", "3"], "check_val_every_n_epoch is beyond trainer.max_epochs 2"),
    ],
)
def test_an_objective_the_base_never_measures_is_refused_up_front(override, why, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    path = write_sweep(tmp_path, **ONE_POINT)  # objective: best_val_acc
    assert sweep_study.main(["--config", str(path), "--data.data_dir", str(tmp_path / "data"), *override]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: objective.metric: best_val_acc is never measured"), err
    assert why in err[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["smoke.yaml"]  # nothing written


@pytest.mark.slow
def test_a_bad_trial_is_pruned_and_one_without_its_objective_fails_with_one_line(fashion_data, tmp_path):
    """One sweep of two trials under a pruner that prunes any value reported (val/acc < 2). The trial that validates
    is pruned after epoch 0, in the study and in its run folder (stopped, then tested). The one whose validation a
    swept key switched off (the up-front check sees only the base) reports nothing: best_val_acc is null, and the
    trial fails with one line."""
    spec = write_sweep(
        tmp_path, seeds=[1], space={"trainer.limit_val_batches": [2, 0]}, pruner={"threshold": {"lower": 2.0}}
    )
    proc = run_sweep(["--config", str(spec), "--data.data_dir", str(fashion_data)], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr[-3000:]
    folder = tmp_path / "logs" / "smoke"
    trials = {
        t.params["trainer.limit_val_batches"]: t
        for t in study_of("smoke", f"sqlite:///{folder / 'study.db'}").get_trials()
    }
    assert sorted(trials) == [0, 2]
    pruned, failed = trials[2], trials[0]
    assert pruned.state == optuna.trial.TrialState.PRUNED and list(pruned.intermediate_values) == [0]
    run = folder / f"version_{pruned.number}"
    assert json.loads((run / "trial.json").read_text())["state"] == "pruned"
    assert json.loads((run / "pruned.json").read_text())["epoch"] == 0
    assert json.loads((run / "results.json").read_text())["epochs"] == 1  # stopped after the first epoch
    hparams = tensorboard_hparams(run)  # HPARAMS compares trials by what the sweep varied
    assert hparams["trial"] == pruned.number and hparams["trainer.limit_val_batches"] == 2
    assert failed.state == optuna.trial.TrialState.FAIL
    info = json.loads((folder / f"version_{failed.number}" / "trial.json").read_text())
    assert info["state"] == "failed" and info["error"].startswith("objective best_val_acc is null in ")
    (line,) = [line for line in proc.stderr.splitlines() if "objective best_val_acc is null" in line]
    assert line.startswith("[W") and f"Trial {failed.number} failed" in line


@pytest.mark.slow
def test_a_ddp_trial_is_pruned_on_every_rank(fashion_data, tmp_path):
    """Two CPU ranks: rank 0 asks the pruner, both stop after epoch 0, the run is tested; no deadlock."""
    spec = write_sweep(tmp_path, **ONE_POINT, pruner={"threshold": {"lower": 2.0}})  # val/acc < 2: prune at once
    args = [
        "--config",
        str(spec),
        "--data.data_dir",
        str(fashion_data),
        "--trainer.strategy",
        "ddp",
        "--trainer.devices",
        "2",
        "--trainer.accelerator",
        "cpu",
    ]
    proc = run_sweep(args, tmp_path, timeout=420)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = pruned_at_once(tmp_path)
    results = json.loads((run / "results.json").read_text())
    assert results["world_size"] == 2 and results["epochs"] == 1  # both ranks stopped after epoch 0, then tested
    assert 0.0 <= results["test_acc"] <= 1.0


@pytest.mark.slow
def test_trials_run_warm_and_give_the_results_of_fit_run_alone(fashion_data, tmp_path):
    """Each trial is a child of the worker's trial server (itself forked from the worker), not a new interpreter;
    its results are those of ``python -m project.fit`` on the trial's config, bit for bit."""
    spec = write_sweep(tmp_path, seeds=[1, 2], space={"model.optimizer.init_args.lr": [0.05]})
    env = {"PYTHONPATH": os.pathsep.join([str(REPO / "tests"), os.environ.get("PYTHONPATH", "")])}
    args = ["--config", str(spec), "--data.data_dir", str(fashion_data), "--trainer.callbacks+=helpers.ProcessTree"]
    proc = run_sweep(args, tmp_path, **env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    folder = tmp_path / "logs" / "smoke"
    servers = set()
    for run in (folder / "version_0", folder / "version_1"):
        info = json.loads((run / "trial.json").read_text())
        tree = json.loads((run / "process.json").read_text())
        worker = int(info["worker"].rsplit(":", 1)[1])
        assert tree["pid"] == info["pid"] and tree["parent"] != worker and tree["grandparent"] == worker
        servers.add(tree["parent"])
    assert len(servers) == 1  # one server for the worker's trials
    alone = subprocess.run(
        [
            sys.executable,
            "-m",
            "project.fit",
            "--config",
            str(folder / "version_1" / "sweep-trial.yaml"),
            "--trainer.logger.init_args.version",
            "alone",
        ],
        cwd=tmp_path,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert alone.returncode == 0, alone.stderr[-3000:]
    warm = json.loads((folder / "version_1" / "results.json").read_text())
    cold = json.loads((folder / "alone" / "results.json").read_text())
    for key in ("test_acc", "test_loss", "best_val_acc", "confusion_matrix", "global_step"):
        assert warm[key] == cold[key], key
