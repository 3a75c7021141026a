"""Command-line input that must work or fail in one readable line, and secrets that must stay out of output:
YAML syntax errors located, Lightning's shorthand class names, several identical Pruning callbacks, Trainer
flags under every precision ``auto_precision`` picks, storage passwords, the DDP rendezvous address."""

from __future__ import annotations

import warnings
from pathlib import Path

import lightning as L
import pytest
import torch
import yaml
from helpers import REPO, results, run_dirs, run_main, tiny_args
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import project.cli
from project import sweep
from project.callbacks import Pruning
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


# -- several Pruning callbacks with identical settings --------------------------------------------------------


class Linear(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(32, 2)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self.lin(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def linear_data():
    g = torch.Generator().manual_seed(0)
    return DataLoader(TensorDataset(torch.randn(64, 32, generator=g), torch.randint(0, 2, (64,), generator=g)), 16)


def record_loads(monkeypatch) -> list[tuple[int, str]]:
    """(copy number, the state's marker) for every Pruning state a resume hands back."""
    loaded: list[tuple[int, str]] = []
    original = Pruning.load_state_dict

    def load_state_dict(self, state):
        loaded.append((self.copy, state.get("marker")))
        original(self, state)

    monkeypatch.setattr(Pruning, "load_state_dict", load_state_dict)
    return loaded


def mark_states(path: Path) -> list[str]:
    """Tag each Pruning state in the checkpoint with its own key; returns the keys in checkpoint order."""
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    keys = [k for k in ckpt["callbacks"] if k.startswith("Pruning{")]
    for k in keys:
        ckpt["callbacks"][k]["marker"] = k
    torch.save(ckpt, path)
    return keys


def test_two_identical_pruning_callbacks_in_a_plain_trainer(tmp_path, monkeypatch):
    def trainer(epochs):
        return L.Trainer(max_epochs=epochs, callbacks=[Pruning(amount=0.3), Pruning(amount=0.3)], logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, default_root_dir=tmp_path)  # fmt: skip

    first, model = trainer(1), Linear()
    first.fit(model, linear_data())
    zeros = int((model.lin.weight == 0).sum())
    assert abs(zeros - (1 - 0.7 * 0.7) * 64) <= 1  # both pruned: 30 %, then 30 % of the rest
    first.save_checkpoint(tmp_path / "a.ckpt")
    keys = mark_states(tmp_path / "a.ckpt")
    assert len(keys) == 2 and "'copy': 1" in keys[1] and "copy" not in keys[0]
    loaded = record_loads(monkeypatch)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*callbacks used to create the checkpoint.*")
        trainer(2).fit(Linear(), linear_data(), ckpt_path=tmp_path / "a.ckpt")
    assert sorted(loaded) == [(0, keys[0]), (1, keys[1])]


def test_two_identical_pruning_callbacks_resume_from_the_cli(tiny_mnist, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    pruning = ["--trainer.callbacks+=project.callbacks.Pruning", "--trainer.callbacks.amount", "0.3"] * 2
    assert run_main(tiny_args(tiny_mnist, tmp_path / "logs", *pruning, "--trainer.limit_train_batches", "2")) == 0
    (run,) = run_dirs(tmp_path / "logs")
    assert results(run)["sparsity"] == pytest.approx(1 - 0.7 * 0.7, abs=1e-3)
    keys = mark_states(run / "checkpoints" / "last.ckpt")
    assert len(keys) == 2
    loaded = record_loads(monkeypatch)
    resume = ["--trainer.max_epochs", "2", "--ckpt_path", str(run / "checkpoints" / "last.ckpt")]
    assert run_main(tiny_args(tiny_mnist, tmp_path / "logs", *pruning, "--trainer.limit_train_batches", "2",
                              *resume)) == 0  # fmt: skip
    assert sorted(loaded) == [(0, keys[0]), (1, keys[1])]
    assert results(run)["epochs"] == 2


# -- the Trainer flags users reach for, under every precision auto_precision may pick -------------------------

FLAGS = {
    "clip_norm": ["--trainer.gradient_clip_val", "1.0"],
    "clip_value": ["--trainer.gradient_clip_val", "0.5", "--trainer.gradient_clip_algorithm", "value"],
    "clip_accumulate": ["--trainer.gradient_clip_val", "1.0", "--trainer.accumulate_grad_batches", "2"],
    "accumulate": ["--trainer.accumulate_grad_batches", "2"],
    "profiler_simple": ["--trainer.profiler", "simple"],
    "profiler_advanced": ["--trainer.profiler", "advanced"],
    "profiler_pytorch": ["--trainer.profiler", "pytorch"],
    "summary": ["--trainer.enable_model_summary", "true"],
    "summary_depth": ["--trainer.callbacks+=ModelSummary", "--trainer.callbacks.max_depth", "3"],
    "anomaly": ["--trainer.detect_anomaly", "true"],
    "bf16_true": ["--trainer.precision", "bf16-true"],
    "bf16_true_clip": ["--trainer.precision", "bf16-true", "--trainer.gradient_clip_val", "1.0"],
}
FAST = {"clip_norm", "clip_value", "clip_accumulate"}  # the ones that failed; the rest guard the matrix


@pytest.mark.parametrize("picked", ["32-true", "bf16-mixed", "16-mixed"])
@pytest.mark.parametrize("flag", [f if f in FAST else pytest.param(f, marks=pytest.mark.slow) for f in FLAGS])
def test_tuned_config_with_trainer_flags_under_each_auto_precision(tiny_mnist, tmp_path, monkeypatch, capsys,
                                                                   picked, flag):  # fmt: skip
    """configs/mnist.yaml (fused AdamW step, channels_last, in-memory data, auto_precision) with each flag, as
    auto_precision would run it on a CUDA GPU (16-mixed; bf16-mixed on a CPU), a CPU with native bf16
    (bf16-mixed) and any other CPU (32-true)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(project.cli, "fastest_precision", lambda accelerator: picked)
    args = [
        "--config", str(REPO / "configs/mnist.yaml"), *tiny_args(tiny_mnist, tmp_path / "logs"),
        "--model.optimizer", "torch.optim.AdamW", "--model.optimizer.fused", "true",
        "--data.num_workers", "0", "--data.persistent_workers", "false", "--trainer.limit_train_batches", "4",
        "--trainer.limit_val_batches", "2", "--trainer.limit_test_batches", "2", *FLAGS[flag],
    ]  # fmt: skip
    status = run_main(args)
    assert status == 0, capsys.readouterr().err[-2000:]
    (run,) = run_dirs(tmp_path / "logs")
    expected = "bf16-true" if "bf16_true" in flag else {"16-mixed": "bf16-mixed"}.get(picked, picked)
    assert results(run)["precision"] == expected
