"""Writes below a folder the user gave follow no link at any component (issue kind: link safety stops at the last
component): symbolic links at the sweep folder, the run folder or the name, a file on the way, a hard link at the
name, and a folder swapped for a link between two writes."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import optuna
import pytest
from helpers import run_main, tiny_args
from lightning.pytorch.callbacks import Callback

from project.errors import ConfigError
from project.runs import files
from project.sweep import server as trial_server
from project.sweep import trial as sweep_trial


def layout(tmp_path: Path) -> tuple[Path, Path, Path]:
    """``(logs, run, outside)``: the folder the user gave, a trial's run folder below it, a folder elsewhere."""
    logs, outside = tmp_path / "logs", tmp_path / "outside"
    logs.mkdir()
    outside.mkdir()
    return logs, logs / "sweep" / "version_3", outside


@pytest.mark.parametrize("where", ["sweep folder", "run folder"])
def test_a_link_at_any_folder_under_the_given_one_is_refused_and_nothing_lands_outside(where, tmp_path):
    logs, run, outside = layout(tmp_path)
    link = run.parent if where == "sweep folder" else run
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(outside, target_is_directory=True)
    with pytest.raises(OSError) as refused:
        files.write_json(run / "trial.json", {"state": "running"}, below=logs)
    assert refused.value.errno in (errno.ELOOP, errno.ENOTDIR)
    assert list(outside.rglob("*")) == []
    with pytest.raises(OSError):
        files.unlink_below(run / "pruned.json", logs)


def test_a_file_on_the_way_is_refused(tmp_path):
    logs, run, _ = layout(tmp_path)
    run.parent.mkdir()
    run.write_text("not a folder")
    with pytest.raises(OSError) as refused:
        files.write_text(run / "sweep-trial.yaml", "x: 1\n", below=logs)
    assert refused.value.errno == errno.ENOTDIR and run.read_text() == "not a folder"


@pytest.mark.parametrize("kind", ["symbolic", "hard"])
def test_a_link_at_the_name_is_replaced_and_its_target_untouched(kind, tmp_path):
    logs, run, outside = layout(tmp_path)
    run.mkdir(parents=True)
    victim = outside / "victim.json"
    victim.write_text("precious")
    (run / "trial.json").symlink_to(victim) if kind == "symbolic" else os.link(victim, run / "trial.json")
    files.write_json(run / "trial.json", {"state": "done"}, below=logs)
    assert victim.read_text() == "precious" and os.stat(victim).st_nlink == 1
    assert not (run / "trial.json").is_symlink() and json.loads((run / "trial.json").read_text()) == {"state": "done"}


def test_a_run_folder_swapped_for_a_link_between_two_writes_is_caught_at_the_second(tmp_path):
    logs, run, outside = layout(tmp_path)
    files.write_json(run / "trial.json", {"state": "running"}, below=logs)  # creates the folders, in place
    run.rename(tmp_path / "moved")
    run.symlink_to(outside, target_is_directory=True)
    with pytest.raises(OSError):
        files.write_json(run / "trial.json", {"state": "complete"}, below=logs)
    assert list(outside.iterdir()) == []


def test_a_trial_whose_run_folder_is_a_link_fails_in_one_line_naming_it(tmp_path):
    """The sweep's own steps: preparing a trial's run folder behind a planted link is one ConfigError naming the
    folder; a planted link at the sweep folder the same; nothing is written outside."""
    logs, run, outside = layout(tmp_path)
    trial = optuna.create_study().ask()
    run.parent.mkdir()
    run.symlink_to(outside, target_is_directory=True)
    with pytest.raises(ConfigError, match=r"version_3: a symbolic link or a file stands on the way") as refused:
        sweep_trial._prepare_run(run.parent, trial, 3, retried=False)
    assert "\n" not in str(refused.value) and list(outside.iterdir()) == []
    with pytest.raises(ConfigError):
        sweep_trial.write_trial_file(run, "trial.json", {"state": "running"})
    run.unlink()
    run.parent.rmdir()
    run.parent.symlink_to(outside, target_is_directory=True)
    with pytest.raises(ConfigError):
        sweep_trial._prepare_run(run.parent, trial, 3, retried=False)
    assert list(outside.iterdir()) == []


def test_a_hard_link_at_a_trials_log_is_replaced_never_appended_to(tmp_path):
    victim = tmp_path / "victim.log"
    victim.write_text("precious\n")
    log = tmp_path / "sweep-fit.log"
    os.link(victim, log)
    fd = trial_server.open_log(log)
    try:
        os.write(fd, b"fit output\n")
    finally:
        os.close(fd)
    assert victim.read_text() == "precious\n" and log.read_text() == "fit output\n"
    fd = trial_server.open_log(log)  # its own log, one name: appended to, as a retry does
    try:
        os.write(fd, b"again\n")
    finally:
        os.close(fd)
    assert log.read_text() == "fit output\nagain\n"


def test_the_given_folder_is_created_when_missing(tmp_path):
    """A sweep whose study lives elsewhere (PostgreSQL) starts before the logs folder exists: it is created."""
    logs = tmp_path / "new" / "logs"
    trial = optuna.create_study().ask()
    run, info = sweep_trial._prepare_run(logs / "sweep", trial, 0, retried=False)
    assert run.is_dir() and info == {} and run == logs / "sweep" / "version_0"


class SwapAt(Callback):
    """Test-only: at the start of the second training epoch, moves ``what`` of the run (``run``: the run folder,
    ``checkpoints``, ``experiment``: the folder above it) to ``<what>.moved`` and puts a symbolic link to ``outside``
    in its place, as someone with write access to the logs folder could mid-run."""

    def __init__(self, what: str, outside: str) -> None:
        self.what, self.outside = what, outside

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        if trainer.current_epoch != 1:
            return
        run = Path(trainer.logger.log_dir)
        target = {"run": run, "checkpoints": run / "checkpoints", "experiment": run.parent}[self.what]
        target.rename(target.with_name(target.name + ".moved"))
        target.symlink_to(self.outside, target_is_directory=True)


@pytest.mark.parametrize("what", ["experiment", "run", "checkpoints"])
def test_a_folder_swapped_for_a_link_mid_fit_stops_the_run_and_nothing_lands_outside(
    what, tiny_mnist, tmp_path, monkeypatch, capsys
):
    """fit's own files (checkpoints through Lightning's checkpoint IO, metrics.csv, results.json, TensorBoard's events
    and hparams.yaml) are written below the logger's save_dir through directory descriptors: a folder of the run
    swapped for a link after the first epoch is refused at the next write, one ``error:`` line naming it; nothing
    lands in the link's target, and the failed run's clean-up removes nothing through the link either."""
    monkeypatch.chdir(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious.txt").write_text("keep me")
    swap = ["--trainer.callbacks+=test_links_below.SwapAt", "--trainer.callbacks.what", what]
    swap += ["--trainer.callbacks.outside", str(outside)]
    assert run_main(tiny_args(tiny_mnist, tmp_path / "logs", "--trainer.max_epochs", "2", *swap)) == 1
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(err) == 1 and "a symbolic link or a file stands where a folder under" in err[0], err
    assert sorted(p.name for p in outside.rglob("*")) == ["precious.txt"]
    moved = next((tmp_path / "logs").rglob("*.moved"))
    assert any(moved.rglob("epoch00-*.ckpt"))  # what the first epoch wrote stays where it was written
