"""What a run-folder command reads comes from its command line, and a run folder's files are data (found by a
fresh tester of the one-CLI redesign): a run config that sets a command option, fit's resume or logger options on a
command, an output path that cannot be written, stray or hand-edited files in a run folder."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import yaml
from helpers import REPO, own_data, run_dirs, run_main, tiny_args

from project import evaluate, export, predict
from project.runs import layout


@pytest.fixture
def run_copy(trained_run, tmp_path):
    """A private copy of the session's trained run (this module edits its files)."""
    copy = tmp_path / "logs" / "tiny" / "version_0"
    shutil.copytree(trained_run, copy)
    return copy


def one_error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


@pytest.mark.slow
@pytest.mark.parametrize(
    "planted, main, argv",
    [
        ({"ckpt": "last", "split": "val"}, evaluate.main, []),
        ({"inputs": ["x.png"], "out": "/tmp/elsewhere.csv"}, predict.main, []),
        ({"format": "torchscript", "atol": 1.0}, export.main, []),
    ],
)
def test_a_run_config_never_sets_a_commands_own_options(planted, main, argv, run_copy, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    config = run_copy / "config.yaml"
    config.write_text(yaml.safe_dump({**yaml.safe_load(config.read_text()), **planted}))
    before = sorted(p.name for p in run_copy.iterdir())
    assert main([str(run_copy), *argv]) == 2
    line = one_error(capsys)
    assert str(config) in line and sorted(planted)[0] in line and "not a run setting" in line
    assert sorted(p.name for p in run_copy.iterdir()) == before


@pytest.mark.parametrize(
    "extra, expected",
    [
        (["--ckpt_path", "last"], "--ckpt_path is fit's resume option"),
        (["--trainer.logger", "TensorBoardLogger"], "takes no logger"),
        (["--trainer.logger.init_args.save_dir=elsewhere"], "takes no logger"),
    ],
)
def test_fits_resume_and_logger_options_are_refused_by_the_commands(
    extra, expected, run_copy, tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    assert evaluate.main([str(run_copy), *own_data(run_copy), *extra]) == 2
    assert expected in one_error(capsys)
    assert run_dirs(tmp_path / "logs") == [run_copy] and not (tmp_path / "elsewhere").exists()


def test_an_output_that_cannot_be_written_is_one_line(run_copy, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    from PIL import Image

    Image.new("L", (28, 28), 100).save(tmp_path / "x.png")
    (tmp_path / "folder").mkdir()
    (tmp_path / "a-file").write_text("")
    for out in ("folder", "", "a-file/under.csv"):
        assert predict.main([str(run_copy), "x.png", "--out", out]) == 2, out
        assert "--out" in one_error(capsys)
    assert export.main([str(run_copy), *own_data(run_copy), "--format", "torchscript", "--out", "a-file/m.pt"]) == 2
    assert "--out" in one_error(capsys)


def test_stray_files_in_a_run_folder_are_not_configs_and_best_stays_inside(run_copy, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (run_copy / "config-resume-backup.yaml").write_text("not: [a config")
    (run_copy / "config-resume-1.yaml").write_text((run_copy / "config.yaml").read_text())
    assert layout.latest_config(run_copy) == run_copy / "config-resume-1.yaml"
    # results.json names its best checkpoint by an absolute path: a copied run (or a planted path) uses only the
    # file name, inside this run's checkpoints/
    results = json.loads((run_copy / "results.json").read_text())
    elsewhere = tmp_path / "other" / "checkpoints" / "planted.ckpt"
    elsewhere.parent.mkdir(parents=True)
    shutil.copy(run_copy / "checkpoints" / "last.ckpt", elsewhere)
    own = run_copy / "checkpoints" / results["best_ckpt"].rsplit("/", 1)[1]
    assert layout.checkpoint_of(run_copy, "best") == own  # the original's absolute path points at the trained run
    results["best_ckpt"] = str(elsewhere)
    (run_copy / "results.json").write_text(json.dumps(results))
    assert layout.checkpoint_of(run_copy, "best") != elsewhere
    assert layout.checkpoint_of(run_copy, "best").parent == run_copy / "checkpoints"


def test_a_csv_logger_beside_metrics_csv_is_refused_and_runs_without_it(tiny_mnist, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    csv_logger = [
        "--trainer.logger",
        "lightning.pytorch.loggers.CSVLogger",
        "--trainer.logger.init_args.save_dir",
        str(tmp_path / "csv"),
    ]
    base = tiny_args(tiny_mnist, tmp_path / "logs", "--trainer.limit_train_batches", "2")
    assert run_main([*base, *csv_logger]) == 2
    assert "CSVLogger writes metrics.csv" in one_error(capsys)
    assert not (tmp_path / "csv").exists()
    assert run_main([*base, *csv_logger, "--metrics_csv", "null"]) == 0
    (run,) = sorted((tmp_path / "csv").glob("*/version_*"))
    assert (run / "metrics.csv").is_file() and (run / "results.json").is_file()


@pytest.mark.slow
def test_trust_checkpoint_is_not_passed_on_through_the_saved_config(tiny_mnist, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert run_main(tiny_args(tiny_mnist, tmp_path / "logs", "--trust_checkpoint", "true")) == 0
    (run,) = run_dirs(tmp_path / "logs")
    assert yaml.safe_load((run / "config.yaml").read_text())["trust_checkpoint"] is False


@pytest.mark.slow
def test_a_config_error_is_the_only_line_of_a_process(tmp_path):
    """Checks run before LightningCLI seeds: no ``Seed set to 42`` line before the error."""
    for argv in (["--trainer.plugins", "null"], ["--throughput", "null"]):
        env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}
        done = subprocess.run(
            [sys.executable, "-m", "project.fit", *argv],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
        )
        assert done.returncode == 2
        assert done.stderr.count("\n") == 1 and done.stderr.startswith("error: "), done.stderr
        assert not (tmp_path / "logs").exists()
