"""A run-folder command on a run of any kind (issue 34): whatever strategy, devices and nodes the run trained with,
``evaluate``, ``predict`` and ``export`` rebuild it as one process on one device, and their output is complete and
equal to the single-process answer."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import yaml
from helpers import LAUNCH_VARIABLES, REPO, own_data, results, run_dirs
from lightning.pytorch.strategies import SingleDeviceStrategy
from PIL import Image

from project import evaluate, export, predict
from project.cli.commands import cli_for_run

COMMANDS = {"evaluate": evaluate, "predict": predict, "export": export}

# trainer settings of runs trained by more than one process (or by a strategy a command does not need)
STRATEGIES = {
    "ddp_cpu overlay": {"accelerator": "cpu", "strategy": "ddp", "devices": 2, "num_nodes": 1},
    "BoundDDPStrategy": {
        "accelerator": "cpu",
        "strategy": {"class_path": "project.cluster.BoundDDPStrategy", "init_args": {"listen_address": "127.0.0.1"}},
        "devices": 2,
    },
    "ddp_spawn": {"accelerator": "cpu", "strategy": "ddp_spawn", "devices": 2},
    "ddp_find_unused_parameters_true": {"strategy": "ddp_find_unused_parameters_true", "devices": 2},
    "2 nodes x 1": {"accelerator": "cpu", "strategy": "ddp", "devices": 1, "num_nodes": 2},
    "2 nodes x 2": {"accelerator": "cpu", "strategy": "ddp", "devices": 2, "num_nodes": 2},
    "ddp, devices auto": {"accelerator": "cpu", "strategy": "ddp", "devices": "auto"},
    "fsdp": {"strategy": "fsdp", "devices": 2},
    "single_device": {"accelerator": "cpu", "strategy": "single_device", "devices": 1},
}


def eight_pngs(folder):
    """Eight seeded 28 x 28 grayscale noise images in ``folder``."""
    folder.mkdir()
    rng = np.random.default_rng(0)
    for i in range(8):
        Image.fromarray(rng.integers(0, 256, (28, 28), dtype=np.uint8), mode="L").save(folder / f"{i}.png")
    return folder


@pytest.fixture(scope="module")
def reference_predictions(trained_run, tmp_path_factory):
    """``predict``'s rows on the session's trained run as it is (one process): {file name: row}."""
    tmp = tmp_path_factory.mktemp("reference")
    out = tmp / "preds.csv"
    assert predict.main([str(trained_run), str(eight_pngs(tmp / "images")), "--out", str(out)]) == 0
    return {r["path"].rsplit("/", 1)[-1]: r for r in csv.DictReader(out.open())}


def as_trained_with(trained_run, tmp_path, trainer: dict):
    """A copy of the session's trained run whose ``config.yaml`` says it trained with ``trainer``'s settings."""
    run = tmp_path / "logs" / "tiny" / "version_0"
    shutil.copytree(trained_run, run)
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["trainer"].update(trainer)
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    return run


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize(
    "strategy", [pytest.param(s, marks=() if s == "ddp_cpu overlay" else pytest.mark.slow) for s in STRATEGIES]
)
def test_a_command_runs_any_run_as_one_process_with_the_single_process_answer(
    strategy, command, trained_run, reference_predictions, tiny_mnist, tmp_path, monkeypatch
):
    """``tiny_mnist``: the md5 tables of the data the session's run trained on (the same seeded archives)."""
    monkeypatch.chdir(tmp_path)
    run = as_trained_with(trained_run, tmp_path, STRATEGIES[strategy])
    images = eight_pngs(tmp_path / "images")
    argv = {
        "evaluate": [str(run), *own_data(run)],
        "predict": [str(run), str(images), "--out", str(tmp_path / "preds.csv")],
        "export": [str(run), *own_data(run), "--format", "pt2", "--repeats", "1"],
    }[command]
    # rebuilt as the command rebuilds it: one process on one device (checked before anything could launch more)
    trainer = cli_for_run(run, argv, f"python -m project.{command}", COMMANDS[command].COMMAND).trainer
    assert (trainer.world_size, trainer.num_nodes, trainer.num_devices) == (1, 1, 1)
    assert isinstance(trainer.strategy, SingleDeviceStrategy)

    assert COMMANDS[command].main(argv) == 0
    if command == "evaluate":
        out, want = json.loads((run / "eval-best-test.json").read_text()), results(trained_run)
        assert (out["acc"], out["samples"]) == (want["test_acc"], 100)
        assert out["confusion_matrix"] == want["confusion_matrix"]
    elif command == "predict":
        rows = {r["path"].rsplit("/", 1)[-1]: r for r in csv.DictReader((tmp_path / "preds.csv").open())}
        assert sorted(rows) == [f"{i}.png" for i in range(8)]  # all eight, not one process's share
        for name, row in rows.items():
            assert {k: v for k, v in row.items() if k != "path"} == {
                k: v for k, v in reference_predictions[name].items() if k != "path"
            }
    else:
        record = json.loads((run / "export.json").read_text())["pt2"]
        assert record["max_abs_diff"] <= 1e-4 and record["argmax_agree"] == 1.0
        assert (run / "model-best.pt2").is_file()


@pytest.mark.slow
def test_predict_asked_for_more_than_one_process_is_one_line(trained_run, tmp_path):
    """Several processes would each write their share of the inputs into the same CSV: refused, nothing written.
    (A process of its own: the old code started a second one, which must not be pytest.)"""
    images = eight_pngs(tmp_path / "images")
    out = tmp_path / "preds.csv"
    argv = [str(trained_run), str(images), "--out", str(out), "--trainer.accelerator", "cpu"]
    done = subprocess.run(
        [sys.executable, "-m", "project.predict", *argv, "--trainer.strategy", "ddp", "--trainer.devices", "2"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    err = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(err) == 1, done.stderr
    assert err[0].startswith("error: trainer.devices/num_nodes: 2 processes"), err
    assert not out.exists()


def python_m(cwd, *args: str) -> subprocess.CompletedProcess:
    """``python -m ARGS`` in ``cwd`` as a user starts it (no launcher's variables); it must succeed."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(LAUNCH_VARIABLES)}
    done = subprocess.run([sys.executable, "-m", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def short_fashion_fit(cwd, fashion_data, *overlays: str):
    """A 1-epoch run of configs/fashion_mnist.yaml plus ``overlays`` (4 training, 2 validation, 2 test batches) in
    ``cwd/logs``, as its own process: the run folder."""
    python_m(
        cwd,
        "project.fit",
        *("--config", str(REPO / "configs/fashion_mnist.yaml"), *overlays),
        *("--data.data_dir", str(fashion_data), "--data.num_workers", "0", "--data.persistent_workers", "false"),
        *("--trainer.max_epochs", "1", "--trainer.limit_train_batches", "4", "--trainer.limit_val_batches", "2"),
        *("--trainer.limit_test_batches", "2", "--trainer.enable_progress_bar", "false"),
        *("--trainer.logger.init_args.save_dir", str(cwd / "logs")),
    )
    (run,) = run_dirs(cwd / "logs")
    return run


@pytest.fixture(scope="module")
def ddp_fashion_run(fashion_data, tmp_path_factory):
    """The issue's run, built once for the module: ``fit`` of configs/fashion_mnist.yaml with
    ``configs/trainer/ddp_cpu.yaml`` (2 processes, its own process tree) for 1 short epoch. Read it, don't change it
    (copy it to run a command on it)."""
    run = short_fashion_fit(
        tmp_path_factory.mktemp("ddp_fashion"), fashion_data, "--config", str(REPO / "configs/trainer/ddp_cpu.yaml")
    )
    assert results(run)["world_size"] == 2
    return run


def copy_run(run, folder):
    """A copy of ``run`` at ``folder/<experiment>/<version>`` (a command may write into it)."""
    copy = folder / run.parent.name / run.name
    shutil.copytree(run, copy)
    return copy


@pytest.mark.slow
def test_evaluate_asked_for_two_processes_gives_the_single_process_answer(
    ddp_fashion_run, fashion_data, tmp_path, monkeypatch
):
    """``evaluate --trainer.strategy ddp --trainer.devices 2`` (allowed: each process tests its share and the metrics
    are reduced over both) writes the same accuracy, sample count and confusion matrix as one process, once. The one
    process: ``evaluate.main`` here; the two: ``python -m project.evaluate``, which launches them."""
    monkeypatch.chdir(tmp_path)
    run = copy_run(ddp_fashion_run, tmp_path / "logs")
    own = ["--data.data_dir", str(fashion_data), "--data.num_workers", "0", "--data.persistent_workers", "false"]
    own += ["--trainer.limit_test_batches", "1.0"]  # the whole test set (a batch limit is per process)
    assert evaluate.main([str(run), *own]) == 0
    single = json.loads((run / "eval-best-test.json").read_text())
    (run / "eval-best-test.json").unlink()
    python_m(
        tmp_path, "project.evaluate", str(run), *own, "--trainer.accelerator", "cpu", "--trainer.strategy", "ddp",
        "--trainer.devices", "2",
    )  # fmt: skip
    two = json.loads((run / "eval-best-test.json").read_text())
    assert single["samples"] == 10000
    assert {k: two[k] for k in ("acc", "samples", "confusion_matrix")} == {
        k: single[k] for k in ("acc", "samples", "confusion_matrix")
    }
    assert sorted(p.name for p in run.iterdir() if p.name.startswith("eval-")) == ["eval-best-test.json"]


@pytest.mark.slow
def test_predict_on_a_run_trained_by_two_ddp_processes_classifies_every_image(
    ddp_fashion_run, fashion_data, tmp_path, monkeypatch
):
    """The issue's case end to end: ``fit`` with ``configs/trainer/ddp_cpu.yaml`` (2 processes: the module's run),
    then ``predict`` on eight images: all eight rows, the same as the single-process answer (the run's config set to
    one device). ``predict.main`` here, once the run is seen to be rebuilt as one process (a second one launched
    from here would be pytest)."""
    monkeypatch.chdir(tmp_path)
    run = copy_run(ddp_fashion_run, tmp_path / "logs")
    single = copy_run(ddp_fashion_run, tmp_path / "single")
    config = yaml.safe_load((single / "config.yaml").read_text())
    config["trainer"].update(strategy="auto", devices=1)
    (single / "config.yaml").write_text(yaml.safe_dump(config))
    images = eight_pngs(tmp_path / "images")
    tables = []
    for folder, out in ((run, "ddp.csv"), (single, "single.csv")):
        argv = [str(folder), str(images), "--out", str(tmp_path / out), "--data.data_dir", str(fashion_data)]
        trainer = cli_for_run(folder, argv, "python -m project.predict", predict.COMMAND).trainer
        assert (trainer.world_size, trainer.num_nodes, trainer.num_devices) == (1, 1, 1)
        assert predict.main(argv) == 0
        tables.append([{k: v for k, v in r.items() if k != "path"} for r in csv.DictReader((tmp_path / out).open())])
    assert len(tables[0]) == 8 and tables[0] == tables[1]
