"""Every config ``--print_config`` prints is accepted back by ``fit --config`` and prints the same again (issue 34);
a config the checks refuse is refused by ``--print_config`` too, with one line and nothing printed."""

from __future__ import annotations

import pytest
from helpers import REPO, run_main

from project.cli.parser import ProjectCLI
from project.runs import claims

CONFIGS = REPO / "configs"
COMBOS = {
    "defaults": [],
    "fashion_mnist": ["--config", str(CONFIGS / "fashion_mnist.yaml")],
    "cifar10 + slim": ["--config", str(CONFIGS / "cifar10.yaml"), "--config", str(CONFIGS / "slim.yaml")],
    "mnist + pruning + amp": [
        *("--config", str(CONFIGS / "mnist.yaml"), "--config", str(CONFIGS / "pruning.yaml")),
        *("--config", str(CONFIGS / "amp.yaml")),
    ],
    "ddp_cpu": ["--config", str(CONFIGS / "trainer/ddp_cpu.yaml")],
    "seed recipe": ["--config", str(CONFIGS / "seed/cifar10.yaml")],
    "run callbacks removed": ["--lr_monitor", "null", "--metrics_csv", "null", "--tensorboard_layout", "null"],
    "run callbacks changed": ["--throughput.window_size", "5", "--lr_monitor.log_momentum", "true"],
    "run callback replaced": ["--lr_monitor", "lightning.pytorch.callbacks.LearningRateMonitor"],
    "callbacks and plugins added": [
        "--trainer.callbacks+=lightning.pytorch.callbacks.EarlyStopping",
        *("--trainer.callbacks.monitor", "val/acc"),
        "--trainer.plugins+=lightning.pytorch.plugins.environments.LightningEnvironment",
    ],
    "no logger": ["--trainer.logger", "false"],
    "logger shorthand": ["--trainer.logger", "TensorBoardLogger", "--trainer.logger.save_dir", "logs"],
    "seed true, precision int": ["--seed_everything", "true", "--trainer.precision", "16"],
    "one-cycle, no checkpointing": [
        *("--model.lr_scheduler", "torch.optim.lr_scheduler.OneCycleLR", "--model.lr_scheduler.max_lr", "0.05"),
        *("--trainer.enable_checkpointing", "false", "--trainer.profiler", "simple"),
    ],
}


def printed(capsys, *args: str) -> str:
    with pytest.raises(SystemExit) as info:
        ProjectCLI([*args, "--print_config"])
    assert info.value.code in (0, None)
    return capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.parametrize("combo", list(COMBOS))
def test_every_printed_config_is_accepted_back(combo, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    text = printed(capsys, *COMBOS[combo])
    config = tmp_path / "printed.yaml"
    config.write_text(text)
    cli = ProjectCLI(["--config", str(config)])  # parsed, checked and built as fit builds it
    claims.release(cli.claimed)
    assert printed(capsys, "--config", str(config)) == text


@pytest.mark.parametrize(
    "argv, key",
    [
        (["--throughput", "null"], "throughput"),
        (["--trainer.plugins", "[]"], "trainer.plugins"),
        (["--seed_everything", "false"], "seed_everything"),
        (["--trainer.benchmark", "true", "--trainer.deterministic", "true"], "trainer.deterministic"),
        (["--trainer.callbacks+=lightning.pytorch.callbacks.LearningRateMonitor"], "trainer.callbacks"),
        (["--trainer.accumulate_grad_batches", "0"], "trainer.accumulate_grad_batches"),
    ],
)
def test_print_config_refuses_what_fit_refuses(argv, key, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for extra in ([], ["--print_config"]):
        assert run_main([*argv, *extra]) == 2
        out, err = capsys.readouterr()
        lines = err.strip().splitlines()
        assert out == "" and len(lines) == 1 and lines[0].startswith(f"error: {key}"), (out, lines)
    assert list(tmp_path.iterdir()) == []


def _nullable_keys() -> list[str]:
    """Every key of the default config whose ``null`` means something other than its default: the run callbacks a
    ``null`` removes (``throughput`` must stay: refused whatever the print) and the trainer's plugins."""
    from project.cli.parser import RUN_CALLBACKS

    return [key for key in RUN_CALLBACKS if key != "throughput"] + ["trainer.plugins"]


@pytest.mark.parametrize("key", _nullable_keys())
def test_skip_null_never_prints_a_config_that_parses_back_to_another(key, tmp_path, monkeypatch, capsys):
    """``--print_config=skip_null`` (offered in --help) dropped the ``null`` that removes a callback: a run from the
    printed file had the callback back, without a word. A null the defaults would fill again is refused by name;
    a skip_null print of a config without one is printed and parses back to the same config."""
    monkeypatch.chdir(tmp_path)
    defaults = ProjectCLI.resolve([])
    assert run_main([f"--{key}", "null", "--print_config=skip_null"]) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert out == "" and len(lines) == 1 and f"skip_null would drop {key}: null" in lines[0], lines
    with pytest.raises(SystemExit):
        ProjectCLI(["--print_config=skip_null"])
    config = tmp_path / "printed.yaml"
    config.write_text(capsys.readouterr().out)
    assert ProjectCLI.resolve(["--config", str(config)]) == defaults
