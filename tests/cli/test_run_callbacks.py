"""Every callback and plugin a run uses is in its config: ``--print_config`` lists it, YAML and the command line
change or remove it, and what must stay is refused with one line (issue: everything visible)."""

from __future__ import annotations

import importlib
import json

import pytest
import yaml
from helpers import REPO, results, run_dirs, run_main, tiny_args
from lightning.pytorch.callbacks import LearningRateMonitor, ModelSummary, ProgressBar

from project.callbacks.checkpoint import RunCheckpoint
from project.callbacks.training import CudnnFlags
from project.cli.parser import ProjectCLI


def class_of(path: str) -> type:
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def printed_config(capsys, *args: str) -> dict:
    with pytest.raises(SystemExit):
        ProjectCLI([*args, "--print_config"])
    return yaml.safe_load(capsys.readouterr().out)


def classes_in(tree) -> set[type]:
    """Every class named by a ``class_path`` anywhere in a printed config."""
    found: set[type] = set()
    if isinstance(tree, dict):
        if isinstance(tree.get("class_path"), str):
            found.add(class_of(tree["class_path"]))
        for value in tree.values():
            found |= classes_in(value)
    elif isinstance(tree, list):
        for value in tree:
            found |= classes_in(value)
    return found


@pytest.mark.parametrize("overlays", [[], ["configs/pruning.yaml"], ["configs/slim.yaml"]])
def test_print_config_lists_every_callback_and_plugin_the_run_uses(overlays, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    configs = [a for o in ["configs/fashion_mnist.yaml", *overlays] for a in ("--config", str(REPO / o))]
    args = [*configs, "--trainer.logger.init_args.save_dir", str(tmp_path / "logs")]
    printed = printed_config(capsys, *args)
    named = classes_in(printed)
    # the two callbacks of a fixed class print as a key with their options, without a class_path
    assert {"monitor", "save_last", "dirpath"} <= set(printed["checkpoint"]) and set(printed["cudnn"]) == {"enabled"}
    named |= {RunCheckpoint, CudnnFlags}
    cli = ProjectCLI(args)
    used = [type(cb) for cb in cli.trainer.callbacks]
    # the Trainer's own progress bar and model summary are its flags enable_progress_bar / enable_model_summary;
    # RunConfig is LightningCLI's save_config_callback (what --print_config itself prints)
    hidden = [c for c in used if c not in named and not issubclass(c, (ProgressBar, ModelSummary))]
    assert [c.__name__ for c in hidden] == ["RunConfig"]
    assert type(cli.trainer.strategy.checkpoint_io) in named
    assert {"throughput", "lr_monitor", "tensorboard_layout", "metrics_csv", "slurm_requeue"} <= set(printed)
    assert printed["trainer"]["plugins"] == [{"class_path": "project.callbacks.LocalAtomicCheckpointIO"}]


@pytest.mark.slow
def test_run_callbacks_can_be_changed_and_removed(tiny_mnist, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    logs = tmp_path / "logs"
    own_monitor = "--trainer.callbacks+=lightning.pytorch.callbacks.LearningRateMonitor"
    assert run_main(tiny_args(tiny_mnist, logs, own_monitor, "--lr_monitor", "null", "--metrics_csv", "null")) == 0
    (run,) = run_dirs(logs)
    assert not (run / "metrics.csv").exists()  # removed: not written
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert config["lr_monitor"] is None and config["metrics_csv"] is None
    assert results(run)["test_acc"] is not None
    cli = ProjectCLI(tiny_args(tiny_mnist, logs, own_monitor, "--lr_monitor", "null"))
    monitors = [cb for cb in cli.trainer.callbacks if isinstance(cb, LearningRateMonitor)]
    assert [type(m).__name__ for m in monitors] == ["LearningRateMonitor"]  # the user's only, no duplicate tags
    cli = ProjectCLI(tiny_args(tiny_mnist, logs, "--lr_monitor.log_momentum", "true"))
    (monitor,) = [cb for cb in cli.trainer.callbacks if isinstance(cb, LearningRateMonitor)]
    assert monitor.log_momentum is True


def test_callbacks_that_write_through_the_logger_are_left_out_without_one(tiny_mnist, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cli = ProjectCLI(tiny_args(tiny_mnist, tmp_path / "logs", "--trainer.logger", "false"))
    names = {type(cb).__name__ for cb in cli.trainer.callbacks}
    assert "Throughput" in names and "SlurmRequeue" in names
    assert not names & {"StepLearningRateMonitor", "TensorBoardLayout", "EpochMetrics"}


def test_slurm_requeue_does_nothing_outside_a_scheduler(tiny_mnist, tmp_path, monkeypatch):
    for var in ("SLURM_JOB_ID", "SLURM_NTASKS", "PROJECT_JOB_ID"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)
    cli = ProjectCLI(tiny_args(tiny_mnist, tmp_path / "logs"))
    root = cli.trainer.default_root_dir
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert cli.trainer.default_root_dir == root
    (run,) = run_dirs(tmp_path / "logs")
    assert not (run / "slurm_job.json").exists()


@pytest.mark.parametrize(
    "extra, expected",
    [
        (["--throughput", "null"], "throughput: null removes the callback"),
        (["--trainer.plugins", "lightning.fabric.plugins.environments.LightningEnvironment"], "no CheckpointIO"),
    ],
)
def test_what_must_stay_is_refused_with_one_line(extra, expected, tiny_mnist, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert run_main(tiny_args(tiny_mnist, tmp_path / "logs", *extra)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and expected in err[0]
    assert run_dirs(tmp_path / "logs") == []


def test_plugins_added_with_plus_keep_the_atomic_checkpoint_io(tiny_mnist, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    extra = "--trainer.plugins+=lightning.fabric.plugins.environments.LightningEnvironment"
    cli = ProjectCLI(tiny_args(tiny_mnist, tmp_path / "logs", extra))
    assert type(cli.trainer.strategy.checkpoint_io).__name__ == "LocalAtomicCheckpointIO"
    plugins = [type(p).__name__ for p in cli.config_init.trainer.plugins]
    assert plugins == ["LocalAtomicCheckpointIO", "LightningEnvironment"]


def test_a_source_dir_that_is_not_a_folder_is_refused_even_with_the_data_in_place(
    tiny_mnist, tmp_path, monkeypatch, capsys
):
    """Found by a new user: with ``data_dir`` already imported a mistyped ``--data.source_dir`` trained silently."""
    monkeypatch.chdir(tmp_path)
    assert run_main(tiny_args(tiny_mnist, tmp_path / "logs", "--trainer.limit_train_batches", "1")) == 0
    capsys.readouterr()
    missing = str(tmp_path / "no-such-folder")
    args = tiny_args(tiny_mnist, tmp_path / "logs", "--data.source_dir", missing)
    assert run_main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"error: data.source_dir: {missing} is not a folder; give the folder holding the archives (see --help)"
    ]
    assert len(run_dirs(tmp_path / "logs")) == 1


@pytest.mark.parametrize(
    "twin, key",
    [
        ("lightning.pytorch.callbacks.LearningRateMonitor", "lr_monitor"),
        (
            '{"class_path": "lightning.pytorch.callbacks.ThroughputMonitor", "init_args": {"batch_size_fn": '
            '"project.callbacks.training.batch_samples"}}',
            "throughput",
        ),
        ("project.callbacks.Throughput", "throughput"),
        ("project.report.epoch_metrics.EpochMetrics", "metrics_csv"),
        ("project.report.results.TensorBoardLayout", "tensorboard_layout"),
    ],
)
def test_a_run_callback_twice_is_refused(twin, key, tiny_mnist, tmp_path, monkeypatch, capsys):
    """Another copy of a run callback in trainer.callbacks would log the same tags (or write the same file) twice."""
    monkeypatch.chdir(tmp_path)
    assert run_main(tiny_args(tiny_mnist, tmp_path / "logs", f"--trainer.callbacks+={twin}")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"run's {key} callback" in err[0] and f"--{key} null" in err[0]
    assert run_dirs(tmp_path / "logs") == []


@pytest.mark.slow
def test_summarize_groups_runs_that_differ_only_in_how_they_are_watched(tiny_mnist, tmp_path, monkeypatch):
    from project import summarize

    monkeypatch.chdir(tmp_path)
    logs = tmp_path / "logs"
    for extra in ([], ["--lr_monitor.log_momentum", "true", "--metrics_csv", "null", "--seed_everything", "7"]):
        assert run_main(tiny_args(tiny_mnist, logs, "--trainer.limit_train_batches", "2", *extra)) == 0
    assert summarize.main([str(logs)]) == 0
    groups = json.loads((logs / "summary.json").read_text())
    assert [g["runs"] for g in groups["groups"].values()] == [2]


def test_summaries_ignore_exactly_the_run_callbacks_keys():
    """summarize groups runs that differ only in how they are watched: the keys it ignores are the parser's."""
    from project.cli.parser import RUN_CALLBACKS
    from project.runs.layout import RUN_CALLBACK_KEYS
    from project.summary.collect import IGNORED

    assert tuple(RUN_CALLBACKS) == RUN_CALLBACK_KEYS and set(RUN_CALLBACK_KEYS) <= set(IGNORED)


@pytest.mark.parametrize("value", ["null", "true"])
def test_logger_null_is_the_default_logger_in_a_run_folder(value, tiny_mnist, tmp_path, monkeypatch):
    """Lightning documents ``logger=None``/``True`` as its default logger: here the run's own, so the run claims its
    folder under ``logs/`` and keeps its config, metrics and learning-rate scalars (was: Lightning's logger in
    ``./lightning_logs/``, the run callbacks that log dropped)."""
    monkeypatch.chdir(tmp_path)
    assert run_main([*tiny_args(tiny_mnist, tmp_path / "ignored"), "--trainer.logger", value]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["logs", "mnist"]  # no lightning_logs/, nothing ignored/
    (run,) = run_dirs(tmp_path / "logs")
    assert run == tmp_path / "logs" / "mnist" / "version_0"
    assert {"config.yaml", "results.json", "metrics.csv", "hparams"} <= {p.name for p in run.iterdir()}
    assert yaml.safe_load((run / "config.yaml").read_text())["trainer"]["logger"]["init_args"]["save_dir"] == "logs"
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tags = EventAccumulator(str(run)).Reload().Tags()["scalars"]
    assert "lr-SGD" in tags and "val/acc" in tags
