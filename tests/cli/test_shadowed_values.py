"""A value as written takes effect or is refused: settings the learning-rate scheduler overwrites (issue kind: a
shadowed setting), checked as ``fit`` and ``--print_config`` check a config, before anything is written."""

from __future__ import annotations

import pytest
import yaml
from helpers import REPO, run_main

MNIST, CIFAR = str(REPO / "configs/mnist.yaml"), str(REPO / "configs/cifar10.yaml")


@pytest.mark.parametrize(
    ("config", "extra", "message"),
    [
        (MNIST, ["--model.optimizer.lr", "0.01"], "model.optimizer.lr: 0.01 is never used: OneCycleLR sets"),
        (CIFAR, ["--model.optimizer.momentum", "0.9"], "model.optimizer.momentum: 0.9 is never used"),
        (MNIST, ["--model.optimizer.betas", "[0.8, 0.999]"], "model.optimizer.betas[0]: 0.8 is never used"),
    ],
    ids=["lr", "momentum", "beta1"],
)
def test_a_value_the_scheduler_overwrites_is_refused_naming_the_key_that_rules(
    config, extra, message, tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    assert run_main(["--config", config, *extra, "--print_config"]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith(f"error: {message}"), errors
    assert ("max_lr" if "lr:" in message else "max_momentum") in errors[0]
    assert not (tmp_path / "logs").exists()


@pytest.mark.parametrize(
    ("config", "extra", "key", "value"),
    [
        (MNIST, ["--model.lr_scheduler.max_lr", "0.01"], "lr_scheduler", {"max_lr": 0.01}),
        (
            CIFAR,
            ["--model.optimizer.momentum", "0.9", "--model.lr_scheduler.cycle_momentum", "false"],
            "optimizer",
            {"momentum": 0.9},
        ),
        (MNIST, ["--model.optimizer.betas", "[0.9, 0.99]"], "optimizer", {"betas": [0.9, 0.99]}),
        (MNIST, ["--model.optimizer.lr", "0.005"], "optimizer", {"lr": 0.005}),  # equal to max_lr: it agrees
    ],
    ids=["max_lr", "no-cycle", "beta2", "lr-equal"],
)
def test_a_value_that_takes_effect_is_kept(config, extra, key, value, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as printed_and_exited:  # --print_config prints and exits 0, as jsonargparse does
        run_main(["--config", config, *extra, "--print_config"])
    assert printed_and_exited.value.code == 0
    printed = yaml.safe_load(capsys.readouterr().out)["model"][key]["init_args"]
    assert {k: printed[k] for k in value} == value
