"""Your own ``nn.Module`` as the net (``model.net: {class_path, init_args}``): trained, measured and pruned through
the CLI, refused in one line when it cannot be, and imported from a run folder only when its package is trusted."""

from __future__ import annotations

import csv
import json
import sys
import uuid

import pytest
import torch
import torchvision
from helpers import results, run_dirs, run_main, tiny_args

from project import evaluate
from project.checkpoints import read_checkpoint
from project.errors import ConfigError
from project.module import ImageClassifier
from project.runs.trust import TRUST_ENV

NETS = """
import os
import pathlib

from torch import nn

if os.environ.get("NETS_MARKER"):  # shows whether this module's code ran
    pathlib.Path(os.environ["NETS_MARKER"]).write_text("imported")


class TinyNet(nn.Module):
    def __init__(self, num_classes: int, hidden: int = 32):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4), nn.Flatten())
        self.head = nn.Sequential(nn.Linear(128, hidden), nn.ReLU(), nn.Linear(hidden, num_classes))

    def forward(self, x):
        return self.head(self.features(x))


class SevenOut(TinyNet):
    def __init__(self, num_classes: int):
        super().__init__(7)
"""


@pytest.fixture
def own_nets(tmp_path, monkeypatch) -> str:
    """A package of the user's own nets on ``sys.path``, under a fresh name; returns the name."""
    name = f"usernets_{uuid.uuid4().hex[:8]}"
    folder = tmp_path / "src"
    folder.mkdir()
    (folder / f"{name}.py").write_text(NETS)
    monkeypatch.syspath_prepend(str(folder))
    yield name
    sys.modules.pop(name, None)


def test_own_net_trains_is_measured_pruned_and_trusted_only_when_named(
    own_nets, tiny_mnist, tmp_path, monkeypatch, capsys
):
    """One fit of a user's net with unstructured pruning: parameters and MACs counted from its layers, half its
    weights pruned, its class path and init args in the checkpoint. A run-folder command on the run imports the
    user's module only once the user names its package in PROJECT_TRUSTED_PACKAGES, and so does
    ``load_from_checkpoint``; evaluate then gives the run's own test accuracy."""
    logs = tmp_path / "logs"
    args = tiny_args(tiny_mnist, logs, "--model.net", f"{own_nets}.TinyNet", "--model.net.hidden", "16")
    args += ["--model.optimizer", "torch.optim.Adam", "--model.optimizer.lr", "0.01"]
    pruning = ["--trainer.callbacks+=project.callbacks.Pruning", "--trainer.callbacks.amount", "0.5"]
    assert run_main([*args, "--trainer.max_epochs", "2", *pruning, "--trainer.callbacks.start_epoch", "1"]) == 0
    (run,) = run_dirs(logs)
    res = results(run)
    # conv 1->8 3x3 (80), linear 128->16 (2,064), linear 16->10 (170)
    assert res["params"] == 80 + 2064 + 170 and res["widths"] is None
    assert res["macs_per_sample"] == 8 * 9 * 28 * 28 + 128 * 16 + 16 * 10
    assert res["sparsity"] == pytest.approx(0.5, abs=0.01) and res["nonzero_params"] < res["params"]
    assert res["test_acc"] > 0.1
    ckpt = read_checkpoint(run / "checkpoints" / "last.ckpt")
    assert ckpt["hyper_parameters"]["net"] == {"class_path": f"{own_nets}.TinyNet", "init_args": {"hidden": 16}}

    # a run-folder command on it, in a session that has not imported the user's module
    sys.modules.pop(own_nets)
    marker = tmp_path / "imported"
    monkeypatch.setenv("NETS_MARKER", str(marker))
    data = ["--data.data_dir", str(tiny_mnist["data"])]
    capsys.readouterr()
    assert evaluate.main([str(run), *data]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and f"names {own_nets}.TinyNet" in errors[0] and f"{TRUST_ENV}={own_nets}" in errors[0]
    assert not marker.exists() and own_nets not in sys.modules
    with pytest.raises(ConfigError, match=f"{own_nets}.TinyNet is not imported"):
        ImageClassifier.load_from_checkpoint(run / "checkpoints" / "last.ckpt")
    assert own_nets not in sys.modules

    monkeypatch.setenv(TRUST_ENV, f"lab.models, {own_nets}")
    assert evaluate.main([str(run), *data, "--ckpt", "last"]) == 0  # the final weights the fit tested (pruned)
    assert marker.exists()
    evaluated = json.loads((run / "eval-last-test.json").read_text())
    assert evaluated["acc"] == pytest.approx(res["test_acc"], abs=1e-6) and evaluated["samples"] == 100
    model = ImageClassifier.load_from_checkpoint(run / "checkpoints" / "last.ckpt")
    assert model(torch.zeros(3, 1, 28, 28)).shape == (3, 10)


@pytest.mark.parametrize(
    ("net", "extra", "message"),
    [
        ("SevenOut", [], "SevenOut maps 2 images of 1x28x28 to (2, 7), not logits (2, 10) (N, num_classes)"),
        ("TinyNet", ["--model.widths", "{channels: [4, 8]}"], "model.widths: only lenet and simple_cnn have widths"),
        (
            "TinyNet",
            ["--trainer.callbacks+=project.callbacks.StructuredPruning"],
            "model.net: StructuredPruning slims lenet and simple_cnn only",
        ),
    ],
    ids=["wrong-logits", "widths", "structured-pruning"],
)
def test_what_cannot_run_on_own_net_is_one_error_line(own_nets, net, extra, message, tiny_mnist, tmp_path, capsys):
    logs = tmp_path / "logs"
    assert run_main(tiny_args(tiny_mnist, logs, "--model.net", f"{own_nets}.{net}", *extra)) != 0
    errors = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("error: ") and message in errors[0], errors
    assert run_dirs(logs) == []


def test_a_trust_setting_that_is_not_a_package_name_is_refused(monkeypatch):
    from project.runs import trust

    monkeypatch.setenv(TRUST_ENV, "mynets, ../evil")
    with pytest.raises(ConfigError, match=r"PROJECT_TRUSTED_PACKAGES: '\.\./evil' is not a package"):
        trust.trusted_packages()


@pytest.mark.slow
def test_every_command_on_an_own_net_run(own_nets, tiny_mnist, tmp_path, monkeypatch):
    """A run of the user's net, stopped after epoch 1 and resumed (``--ckpt_path last``), ends with the weights of an
    uninterrupted 2-epoch run; with its package trusted, predict names the classes and export writes an ONNX file
    that matches the eager net."""
    from PIL import Image

    from project import export, predict

    net = ["--model.net", f"{own_nets}.TinyNet", "--trainer.deterministic", "true"]
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    assert run_main(tiny_args(tiny_mnist, straight, *net, "--trainer.max_epochs", "2")) == 0
    assert run_main(tiny_args(tiny_mnist, stopped, *net, "--trainer.max_epochs", "1")) == 0
    assert run_main(tiny_args(tiny_mnist, stopped, *net, "--trainer.max_epochs", "2", "--ckpt_path", "last")) == 0
    (a,), (b,) = run_dirs(straight), run_dirs(stopped)
    weights = [read_checkpoint(r / "checkpoints" / "last.ckpt")["state_dict"] for r in (a, b)]
    assert weights[0].keys() == weights[1].keys() and all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    assert results(b)["test_acc"] == results(a)["test_acc"]

    monkeypatch.setenv(TRUST_ENV, own_nets)
    Image.new("L", (28, 28), 255).save(tmp_path / "white.png")
    assert predict.main([str(b), str(tmp_path / "white.png"), "--out", str(tmp_path / "p.csv")]) == 0
    (row,) = csv.DictReader((tmp_path / "p.csv").open())
    assert row["label"] == torchvision.datasets.MNIST.classes[int(row["pred"])]  # "3 - three"
    data = ["--data.data_dir", str(tiny_mnist["data"]), "--repeats", "1"]
    assert export.main([str(b), *data, "--out", str(tmp_path / "net.onnx")]) == 0
    assert (tmp_path / "net.onnx").stat().st_size > 4538 * 4  # its 4,538 float32 weights
