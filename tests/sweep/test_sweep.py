"""``python -m project.sweep``: sweep files, trials as run folders, kill -9 and resume, several workers
(SQLite, and PostgreSQL when ``PROJECT_TEST_POSTGRES_URL`` names a server), pruning of bad trials."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import optuna
import pytest
import torch
from helpers import REPO, SMOKE, run_sweep, sigterm_to_pid_1, study_of, write_sweep

from project import summarize
from project.errors import ConfigError
from project.sweep import config as sweep_config
from project.sweep import file as sweep_file
from project.sweep import report as sweep_report
from project.sweep import study as sweep_study

POSTGRES = os.environ.get("PROJECT_TEST_POSTGRES_URL")
POINTS = {(lr, seed) for lr in (0.01, 0.05) for seed in (1, 2)}


def finished_points(study: optuna.Study) -> list[tuple[float, int]]:
    done = study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    return [(t.params["model.optimizer.init_args.lr"], t.params["seed"]) for t in done]


def ran(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """Trials that ran a fit (a surplus trial, which found the grid taken, ran nothing)."""
    return [t for t in study.get_trials() if not t.user_attrs.get("surplus")]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"spaec": {}}, "unknown key 'spaec'"),
        ({"space": {"model.optimizer.init_args.lr": {"floaty": [0, 1]}}}, "unknown distribution 'floaty'"),
        ({"space": {"model.optimizer.init_args.lr": {"log_float": [0, 1]}}}, "log_float needs low > 0"),
        ({"space": {"model.optimizer.init_args.lr": {"float": [0.1, 0.2]}}}, "has no grid"),
        ({"sampler": "tpee"}, "sampler: 'tpee' is not one of grid, random, tpe"),
        ({"objective": {"metric": "acc"}}, "objective.metric: 'acc'"),
        ({"space": {"model.optimizer.init_args.lrr": [0.1]}}, "space.model.optimizer.init_args.lrr: no such key"),
        ({"base": {"args": ["--trainer.max_epochz", "2"]}}, "base:"),
    ],
)
def test_a_bad_sweep_file_is_one_error_line_and_writes_nothing(change, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    path = write_sweep(tmp_path, **change)
    assert sweep_study.main(["--config", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["smoke.yaml"]


@pytest.mark.parametrize(
    ("change", "key", "allowed"),
    [
        ({"heartbeat_s": "fast"}, "heartbeat_s", "is not a number > 0"),
        ({"max_retry": -1}, "max_retry", "is not an integer >= 0"),
        ({"sampler_seed": "x"}, "sampler_seed", "is not an integer"),
        ({"n_trials": 0}, "n_trials", "is not an integer > 0"),
        ({"seeds": [1, "two"]}, "seeds", "distinct integers"),
        ({"sampler": "tpee"}, "sampler", "is not one of grid, random, tpe"),
        ({"objective": {"metric": "test_acc", "goal": "max"}}, "objective", "unknown key 'goal'; objective takes"),
        ({"base": {"args": "--trainer.max_epochs 2"}}, "base.args", "is not a list of fit arguments"),
        (
            {"space": {"model.optimizer.init_args.lr": {"int": [1, 4], "step": 0}}},
            "space.model.optimizer.init_args.lr",
            "int needs [low, high] integers",
        ),
        (
            {
                "space": {
                    "model.optimizer.init_args.lr": {"float": [0.5, 0.1]},
                    "model.optimizer.init_args.momentum": [0],
                },
                "sampler": "random",
                "n_trials": 2,
            },
            "space.model.optimizer.init_args.lr",
            "low < high",
        ),
    ],
)
def test_sweep_file_errors_name_the_file_the_key_and_what_it_takes(change, key, allowed, tmp_path, monkeypatch, capsys):
    """Typed sections parsed by jsonargparse: a wrong type or a value out of range is one line with the file and the
    key (a string where a number belongs was a traceback; the sampler or a range had no file)."""
    monkeypatch.chdir(tmp_path)
    path = write_sweep(tmp_path, **change)
    assert sweep_study.main(["--config", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {path}: {key}: ") and allowed in err[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["smoke.yaml"]


@pytest.mark.parametrize("logger", ["null", "true", "false"])
def test_a_base_with_logger_null_or_true_gives_trials_the_default_logger(logger, tmp_path):
    """``trainer.logger: null`` or ``true`` in a sweep's base means what it means to ``fit`` (the default logger, the
    run's own, in its run folder); ``false`` (no logger: no run folder, no results) is one line."""
    sweep = sweep_file.load_sweep(write_sweep(tmp_path))
    if logger == "false":
        with pytest.raises(ConfigError, match=r"trials need the TensorBoard logger"):
            sweep_config.resolve_base(sweep, ["--trainer.logger", logger])
        return
    base = sweep_config.resolve_base(sweep, ["--trainer.logger", logger])
    assert base["trainer"]["logger"]["class_path"] == "project.report.RunTensorBoardLogger"
    trial = sweep_config.trial_config(base, {}, 42, str(tmp_path / "logs"), "smoke", 3)
    init_args = trial["trainer"]["logger"]["init_args"]
    set_by_project = {"save_dir": str(tmp_path / "logs"), "name": "smoke", "version": 3, "default_hp_metric": False}
    assert {k: init_args[k] for k in set_by_project} == set_by_project and init_args["log_graph"] in (True, False)


def test_report_of_a_sweep_not_run_yet_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert sweep_study.main(["--config", str(SMOKE), "--report"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: no sweep 'smoke' yet")
    assert list(tmp_path.iterdir()) == []


def test_trial_config_sets_dotted_keys_and_swaps_classes():
    base = {
        "seed_everything": 42,
        "trainer": {
            "logger": {"class_path": "TensorBoardLogger", "init_args": {"save_dir": "logs", "name": "x"}},
            "callbacks": [{"class_path": "project.callbacks.Pruning", "init_args": {"amount": 0.5}}],
        },
        "model": {"optimizer": {"class_path": "torch.optim.AdamW", "init_args": {"lr": 0.1, "betas": [0.9, 0.99]}}},
    }
    params = {
        "trainer.callbacks.0.amount": 0.9,
        "model.optimizer.class_path": "torch.optim.SGD",
        "model.optimizer.lr": 0.5,
    }
    cfg = sweep_config.trial_config(base, params, seed=3, save_dir="out", name="sw", version=7)
    assert cfg["trainer"]["callbacks"][0]["init_args"]["amount"] == 0.9
    assert cfg["trainer"]["callbacks"][-1] == {"class_path": "project.sweep.trial.ReportToStudy"}
    assert cfg["model"]["optimizer"] == {"class_path": "torch.optim.SGD", "init_args": {"lr": 0.5}}  # no betas
    assert cfg["seed_everything"] == 3
    assert cfg["trainer"]["logger"]["init_args"] == {"save_dir": "out", "name": "sw", "version": 7}
    assert base["model"]["optimizer"]["init_args"]["lr"] == 0.1  # the base is not changed
    with pytest.raises(ConfigError, match="list of 1; use an index"):
        sweep_config.trial_config(base, {"trainer.callbacks.1.amount": 0.1}, 1, "out", "sw", 0)


def test_grid_points_repeat_each_point_per_seed():
    path = SMOKE
    spec = sweep_file.load_sweep(path)
    assert spec.points() == [{"model.optimizer.init_args.lr": lr, "seed": s} for s in (1, 2) for lr in (0.01, 0.05)]
    assert spec.total() == 4 and sweep_file.load_sweep(path, n_trials=2).total() == 2
    for name in ("pruning", "lr"):
        sweep_file.load_sweep(REPO / f"configs/sweeps/{name}.yaml")  # the shipped sweeps parse


def test_report_groups_completed_trials_and_plots_with_summarize(tmp_path):
    """The report is summarize's tables and plots over the trials: points from completed trials only (a pruned
    trial's better value stays out), mean ± std over seeds, the objective against each swept key and, as the runs
    pruned weights, against sparsity, whatever the objective."""
    spec = sweep_file.load_sweep(write_sweep(tmp_path))  # smoke: lr in {0.01, 0.05} x seeds {1, 2}, best_val_acc
    folder = tmp_path / "logs" / "smoke"
    study = optuna.create_study(direction="maximize")
    lr = optuna.distributions.CategoricalDistribution([0.01, 0.05])
    seed = optuna.distributions.CategoricalDistribution([1, 2])
    trials = [
        (0.01, 1, 0.2, "COMPLETE"),
        (0.05, 1, 0.4, "COMPLETE"),
        (0.01, 2, 0.3, "COMPLETE"),
        (0.05, 2, 0.2, "COMPLETE"),
        (0.01, 2, 0.9, "PRUNED"),
    ]
    for i, (rate, s, value, state) in enumerate(trials):
        run = folder / f"version_{i}"
        run.mkdir(parents=True)
        (run / "results.json").write_text(json.dumps({"best_val_acc": value, "sparsity": 0.5, "epochs": 2, "seed": s}))
        study.add_trial(
            optuna.trial.create_trial(
                state=optuna.trial.TrialState[state],
                value=value if state == "COMPLETE" else None,
                params={"model.optimizer.init_args.lr": rate, "seed": s},
                distributions={"model.optimizer.init_args.lr": lr, "seed": seed},
                user_attrs={"run": str(run)},
            )
        )
    out = sweep_report.report(study, spec, folder)
    points = {p["params"]["model.optimizer.init_args.lr"]: p for p in out["points"]}
    assert {k: (p["n"], p["seeds"], round(p["mean"], 6)) for k, p in points.items()} == {
        0.01: (2, [1, 2], 0.25),
        0.05: (2, [1, 2], 0.3),
    }
    assert points[0.05]["std"] == pytest.approx(0.1414213, abs=1e-6) and points[0.01]["sparsity"] == 0.5
    assert out["best"]["params"] == {"model.optimizer.init_args.lr": 0.05}
    assert len(out["trials"]) == 5 and out["trials"][4]["state"] == "pruned"
    text = (folder / "report.md").read_text()
    assert "Best point: model.optimizer.init_args.lr=0.0500: best_val_acc 0.3000 ± 0.1414 over 2 seed(s)" in text
    assert "| smoke/version_4 | - | trial 4: pruned | 2 | 0.9000 |" in text  # listed, not grouped
    assert out["plots"] == ["val_acc.png", "objective-model.optimizer.init_args.lr.png", "objective-sparsity.png"]
    assert all((folder / name).stat().st_size > 0 for name in out["plots"])
    assert json.loads((folder / "report.json").read_text())["best"] == out["best"]


@pytest.mark.slow
def test_killed_worker_is_resumed_and_the_sweep_ends_with_each_point_once(fashion_data, tmp_path):
    """kill -9 of the worker in trial 0's second epoch; the rerun, two workers, finishes 1-3 and retries 0 from its
    last.ckpt: each point once (none twice, though both workers find trial 0's heartbeat stale), both workers take
    trials, every trial a run folder of its own."""
    spec = write_sweep(tmp_path)
    args = ["--config", str(spec), "--data.data_dir", str(fashion_data), "--trainer.callbacks+=helpers.SleepAtEpoch"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "tests"), os.environ.get("PYTHONPATH", "")])}
    folder = tmp_path / "logs" / "smoke"
    worker = subprocess.Popen(
        [sys.executable, "-m", "project.sweep", *args],
        cwd=tmp_path,
        env={**env, "SWEEP_TEST_SLEEP": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 180
    while not (folder / "version_0" / "checkpoints" / "last.ckpt").is_file():
        assert worker.poll() is None and time.monotonic() < deadline, "trial 0 never wrote its first checkpoint"
        time.sleep(0.2)
    fit_pid = json.loads((folder / "version_0" / "trial.json").read_text())["pid"]
    worker.send_signal(signal.SIGKILL)
    worker.wait()
    for _ in range(100):  # the trial's fit dies with its worker
        try:
            os.kill(fit_pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"fit process {fit_pid} outlived its killed worker")
    proc = run_sweep([*args, "--workers", "2"], tmp_path, PYTHONPATH=env["PYTHONPATH"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    storage = f"sqlite:///{folder / 'study.db'}"
    study = study_of("smoke", storage)
    points = finished_points(study)
    assert sorted(points) == sorted(POINTS)  # exactly 4 finished trials, none duplicated
    rerun = [t for t in ran(study) if t.number > 0]
    assert len(rerun) == 4 and len({t.user_attrs["run"] for t in rerun}) == 4
    assert len({t.user_attrs["worker"] for t in rerun}) == 2  # both workers took trials
    states = {t.number: t.state for t in study.get_trials()}
    assert states[0] == optuna.trial.TrialState.FAIL  # the killed trial, failed by its stale heartbeat ...
    (retry,) = [t for t in study.get_trials() if t.system_attrs.get("failed_trial") == 0]
    assert retry.state == optuna.trial.TrialState.COMPLETE  # ... and retried
    assert sorted(p.name for p in folder.glob("version_*")) == [f"version_{i}" for i in range(4)]
    run0 = folder / "version_0"
    info = json.loads((run0 / "trial.json").read_text())
    assert info["trials"] == [0, retry.number] and info["resumed"] and info["state"] == "complete"
    assert (run0 / "config-resume-1.yaml").is_file()  # fit resumed in place from last.ckpt
    results = json.loads((run0 / "results.json").read_text())
    assert results["epochs"] == 2 and len(results["epoch_time_s"]) == 1  # only the second epoch ran again
    assert info["value"] == retry.value == results["best_val_acc"]
    # The same command again: the study is finished, nothing runs.
    n = len(study.get_trials())
    again = run_sweep(args, tmp_path, PYTHONPATH=env["PYTHONPATH"])
    assert again.returncode == 0 and len(study_of("smoke", storage).get_trials()) == n
    assert "Best point: model.optimizer.init_args.lr=" in again.stdout
    for name in ("report.md", "report.json", "objective-model.optimizer.init_args.lr.png"):
        assert (folder / name).is_file()
    assert summarize.main([str(folder)]) == 0  # the run-folder commands take trials


@pytest.mark.slow
def test_a_trial_whose_fit_is_killed_before_its_first_checkpoint_starts_again_in_its_folder(fashion_data, tmp_path):
    """kill -9 of a trial's fit (its worker lives) after its first step, before any checkpoint: the worker runs the
    point again in the same folder, which the dead try left holding a run (``config.yaml``): it starts afresh
    there instead of being refused as a folder that "already holds a run", and the trial completes."""
    spec = write_sweep(tmp_path, space={"model.optimizer.init_args.lr": [0.05]}, seeds=[1])
    ready, sent = tmp_path / "ready", tmp_path / "sent"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO / "tests"), os.environ.get("PYTHONPATH", "")]),
        **{"SIGNAL_AT": "1", "SIGNAL_READY": str(ready), "SIGNAL_SENT": str(sent)},
    }
    args = ["--config", str(spec), "--data.data_dir", str(fashion_data), "--trainer.callbacks+=helpers.WaitForSignal"]
    worker = subprocess.Popen([sys.executable, "-m", "project.sweep", *args], cwd=tmp_path, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    run = tmp_path / "logs" / "smoke" / "version_0"
    deadline = time.monotonic() + 120
    while not ready.exists():
        assert worker.poll() is None and time.monotonic() < deadline, "the trial's fit never reached its first step"
        time.sleep(0.1)
    assert (run / "config.yaml").is_file() and not list(run.rglob("*.ckpt"))  # a run, no checkpoint yet
    os.kill(json.loads((run / "trial.json").read_text())["pid"], signal.SIGKILL)
    sent.touch()
    out, err = worker.communicate(timeout=180)
    assert worker.returncode == 0, err[-3000:]
    study = study_of("smoke", f"sqlite:///{run.parent / 'study.db'}")
    (trial,) = study.get_trials()
    assert trial.state == optuna.trial.TrialState.COMPLETE
    info = json.loads((run / "trial.json").read_text())
    assert info["state"] == "complete" and not info["resumed"] and info["trials"] == [0]
    assert json.loads((run / "results.json").read_text())["global_step"] == 8  # 2 epochs x 4 steps, from the start
    assert out.count("trial 0: ") >= 2 and "already holds a run" not in (run / "sweep-fit.log").read_text()
    assert sorted(p.name for p in run.parent.glob("version_*")) == ["version_0"]


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PID namespaces")
def test_sigterm_to_pid_1_stops_the_worker_after_its_trial_saved_and_the_retry_resumes_there(fashion_data, tmp_path):
    """The image's PID 1 is tini (Dockerfile): in a PID namespace of its own, SIGTERM to PID 1 (``docker stop``, a
    pod's deletion) reaches the sweep, which passes it to its two workers: the idle one ends at once, the other passes
    it to its trial's fit, which saves ``hpc_ckpt_1.ckpt`` at its step and ends; then that worker ends, the sweep ends
    with 143, and no process of the namespace is left; the trial is still running in the study. The next worker
    finds it stale, retries it, and the retry resumes that run from that checkpoint to its end (not from the epoch's
    ``last.ckpt``, not afresh). Without tini the test is skipped, except in CI, where .ci/run installs it."""
    if shutil.which("tini") is None:
        (pytest.fail if os.environ.get("CI") else pytest.skip)("tini is needed (Debian: apt-get install tini)")
    ready, sent = tmp_path / "ready", tmp_path / "sent"
    spec = write_sweep(tmp_path, seeds=[1], space={"model.optimizer.init_args.lr": [0.05]})  # 2 epochs of 4 steps
    args = ["--config", str(spec), "--data.data_dir", str(fashion_data), "--trainer.callbacks+=helpers.WaitForSignal"]
    path = os.pathsep.join([str(REPO / "tests"), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path, "SIGNAL_AT": "6", "SIGNAL_READY": str(ready), "SIGNAL_SENT": str(sent)}
    sweep = [sys.executable, "-m", "project.sweep", *args, "--workers", "2"]  # the other worker waits, idle
    returncode, out, init = sigterm_to_pid_1(sweep, tmp_path, env, ready, sent)
    assert returncode == 128 + signal.SIGTERM, out[-3000:]
    folder = tmp_path / "logs" / "smoke"
    run = folder / "version_0"
    saved = run / "checkpoints" / "hpc_ckpt_1.ckpt"
    assert torch.load(saved, map_location="cpu", weights_only=True)["global_step"] in (6, 7)
    assert f"trial 0: stopped by SIGTERM; the next worker resumes it from {saved.relative_to(tmp_path)}" in out
    assert not Path(f"/proc/{init}").exists()  # tini ended, and every process of its namespace with it
    storage = f"sqlite:///{folder / 'study.db'}"
    (stopped,) = study_of("smoke", storage).get_trials()
    assert stopped.state == optuna.trial.TrialState.RUNNING  # as after a crash: the next worker retries it
    again = run_sweep(args, tmp_path, PYTHONPATH=path)  # no SIGNAL_AT: runs through
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"trial 1: {run.relative_to(tmp_path)} " in again.stdout and "(resumed from hpc_ckpt_1.ckpt)" in again.stdout
    (retry,) = [t for t in study_of("smoke", storage).get_trials() if t.system_attrs.get("failed_trial") == 0]
    assert retry.state == optuna.trial.TrialState.COMPLETE
    info = json.loads((run / "trial.json").read_text())
    assert info["trials"] == [0, retry.number] and info["resumed"] and info["state"] == "complete"
    results = json.loads((run / "results.json").read_text())
    assert results["global_step"] == 8 and results["epochs"] == 2 and info["value"] == results["best_val_acc"]


@pytest.mark.slow
@pytest.mark.skipif(not POSTGRES, reason="no PostgreSQL server: set PROJECT_TEST_POSTGRES_URL (.ci/run starts one)")
def test_two_workers_share_a_postgresql_study(fashion_data, tmp_path):
    """Two workers on one PostgreSQL study (two on SQLite: the killed-worker test's rerun)."""
    name = f"smoke_{uuid.uuid4().hex[:8]}"
    spec = write_sweep(tmp_path, name=name)
    args = ["--config", str(spec), "--data.data_dir", str(fashion_data), "--workers", "2", "--storage", POSTGRES]
    proc = run_sweep(args, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    study = study_of(name, POSTGRES)
    assert sorted(finished_points(study)) == sorted(POINTS)  # no point twice, none left out
    trials = ran(study)
    assert len(trials) == 4 and len({t.user_attrs["run"] for t in trials}) == 4
    assert len({t.user_attrs["worker"] for t in trials}) == 2  # both workers took trials
    folder = tmp_path / "logs" / name
    assert sorted(p.name for p in folder.glob("version_*")) == [f"version_{t.number}" for t in trials]
