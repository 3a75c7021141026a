"""``seed_everything`` as fit's ``--help`` documents it (issue 34): an int, or ``true`` for a random seed, which is
drawn once, drives the split and shuffling as well as Lightning's seeding, is recorded in ``config.yaml``,
``results.json`` and HPARAMS, and repeats exactly from the run's ``config.yaml``."""

from __future__ import annotations

import os

import pytest
import torch
import yaml
from helpers import results, run_dirs, run_main, tiny_args

from project.cli.parser import ProjectCLI


def weights(run) -> dict:
    return torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]


def recorded_seed(config) -> int:
    return yaml.safe_load(config.read_text())["seed_everything"]


def test_true_draws_one_seed_for_lightning_and_the_split(tiny_mnist, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = tiny_args(tiny_mnist, tmp_path / "logs", "--trainer.logger", "false", "--seed_everything", "true")
    seeds = []
    for _ in range(2):
        cli = ProjectCLI(args)
        seed = cli.config.seed_everything
        assert type(seed) is int and 0 <= seed < 2**32
        assert cli.datamodule.hparams.seed == seed and os.environ["PL_GLOBAL_SEED"] == str(seed)
        seeds.append(seed)
    assert seeds[0] != seeds[1]  # drawn, not a constant (equal with probability 2**-32)


@pytest.mark.slow
def test_true_is_recorded_and_the_run_repeats_from_its_config(tiny_mnist, tmp_path, monkeypatch):
    """A run with ``--seed_everything true`` (1 epoch), resumed with the same command line for a second epoch,
    keeps its seed; a new run from its ``config.yaml`` (2 epochs) ends with the same weights and results."""
    monkeypatch.chdir(tmp_path)
    logs = tmp_path / "logs"
    assert run_main(tiny_args(tiny_mnist, logs, "--seed_everything", "true")) == 0
    (run,) = run_dirs(logs)
    seed = recorded_seed(run / "config.yaml")
    assert type(seed) is int and results(run)["seed"] == seed
    resume = ["--seed_everything", "true", "--trainer.max_epochs", "2", "--ckpt_path", "last"]
    assert run_main(tiny_args(tiny_mnist, logs, *resume)) == 0
    assert recorded_seed(run / "config-resume-1.yaml") == seed and results(run)["seed"] == seed
    again = ["--config", str(run / "config.yaml"), "--trainer.logger.init_args.version", "null"]
    assert run_main([*again, "--trainer.max_epochs", "2"]) == 0
    (other,) = [r for r in run_dirs(logs) if r != run]
    assert results(other)["seed"] == seed
    for key in ("test_acc", "test_loss", "best_val_acc", "global_step"):
        assert results(other)[key] == results(run)[key], key
    a, b = weights(run), weights(other)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize(
    "argv, env, message",
    [
        (["--seed_everything", "false"], {}, "error: seed_everything: false leaves the run unseeded"),
        (["--seed_everything", "true"], {"WORLD_SIZE": "2"}, "error: seed_everything: true would draw a different"),
        (["--seed_everything", "true"], {"SLURM_NTASKS": "4"}, "error: seed_everything: true would draw a different"),
    ],
    ids=["false", "torchrun", "srun"],
)
def test_a_seed_that_cannot_be_kept_is_one_line(argv, env, message, tiny_mnist, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PL_GLOBAL_SEED", raising=False)  # torchrun and srun pass none (an earlier fit here set it)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert run_main(tiny_args(tiny_mnist, tmp_path / "logs", *argv)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(message), err
    assert not (tmp_path / "logs").exists() or run_dirs(tmp_path / "logs") == []


def test_a_process_lightning_launched_takes_the_seed_its_parent_drew(tiny_mnist, tmp_path, monkeypatch):
    """Lightning's DDP launcher starts rank 1 with the parent's environment, ``PL_GLOBAL_SEED`` included."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("PL_GLOBAL_SEED", "1234")
    cli = ProjectCLI(tiny_args(tiny_mnist, tmp_path / "logs", "--trainer.logger", "false", "--seed_everything", "true"))
    assert cli.config.seed_everything == 1234 and cli.datamodule.hparams.seed == 1234
