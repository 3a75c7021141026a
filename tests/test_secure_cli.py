"""Command-line input that must work or fail in one readable line, and secrets that must stay out of output:
YAML syntax errors located, Lightning's shorthand class names, several identical Pruning callbacks, Trainer
flags under every precision ``auto_precision`` picks, storage passwords, the DDP rendezvous address."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from helpers import REPO, run_main, tiny_args

from project import sweep
from project.cli import ProjectCLI
from project.report import RunTensorBoardLogger

# -- YAML syntax errors name the file, line and column --------------------------------------------------------


@pytest.mark.parametrize("form", ["config", "config=", "overlay"])
def test_yaml_syntax_error_names_file_line_and_column(tmp_path, capsys, form):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  lr: [0.1\n")
    args = {
        "config": ["--config", str(bad)],
        "config=": [f"--config={bad}"],
        "overlay": ["--config", str(REPO / "configs/mnist.yaml"), "--config", str(bad)],
    }[form]
    assert run_main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith(f"error: {bad}, line 3, column 1: not valid YAML")
    assert "starts at line 2, column 7" in err[0]


def test_sweep_file_yaml_syntax_error_names_file_line_and_column(tmp_path, capsys):
    path = tmp_path / "sw.yaml"
    path.write_text("name: x\nspace: {a: [1, 2}\n")
    assert sweep.main(["--config", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: --config: {path}, line 2, column 17: not valid YAML")
    bad = tmp_path / "bad.yaml"
    bad.write_text("trainer:\n  max_epochs: 1\n\tfoo: 2\n")
    path.write_text(yaml.safe_dump({"name": "x", "base": {"config": [str(bad)]}, "space": {"model.lr": [1, 2]}}))
    assert sweep.main(["--config", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: base: {bad}, line 3, column 1: not valid YAML")
    assert not (tmp_path / "logs").exists()


# -- Lightning's shorthand class names ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "logger", ["TensorBoardLogger", "lightning.pytorch.loggers.TensorBoardLogger", "project.report.TensorBoardLogger"]
)
def test_tensorboard_logger_shorthand_is_the_project_logger(tmp_path, logger):
    cli = ProjectCLI(["--trainer.logger", logger, "--trainer.logger.save_dir", str(tmp_path)])
    assert type(cli.trainer.logger) is RunTensorBoardLogger
    assert cli.trainer.logger.save_dir == str(tmp_path)
    assert cli.trainer.logger.name == "mnist"  # the project's defaults are kept
