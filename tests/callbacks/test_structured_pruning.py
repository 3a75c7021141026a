"""Structured pruning (``project.slim``): the net is physically slimmed, checkpoints load strictly, resume is exact."""

from __future__ import annotations

import json
import re
import shutil
import warnings

import lightning as L
import pytest
import torch
from helpers import REPO, own_data, results, run_dirs, run_main, run_module, tiny_args
from PIL import Image
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch import nn

from project import evaluate, export, predict
from project.callbacks.slim import StructuredPruning, kept, slim
from project.cli.commands import cli_for_run, load_weights
from project.errors import ConfigError
from project.module import ImageClassifier
from project.nets import LeNet, SimpleCNN, build_net, macs_per_sample

SLIM = str(REPO / "configs/slim.yaml")
STEP_LR = [
    "--model.optimizer",
    "torch.optim.SGD",
    "--model.optimizer.lr",
    "0.01",
    "--model.optimizer.momentum",
    "0.9",
    "--model.lr_scheduler",
    "torch.optim.lr_scheduler.StepLR",
    "--model.lr_scheduler.step_size",
    "1",
    "--model.lr_scheduler.gamma",
    "0.5",
    "--trainer.deterministic",
    "true",
]
# configs/slim.yaml on LeNet: 32 % of 20/50/500 removed -> 13/34/340
SLIM_LENET = {"channels": [13, 34], "hidden": [340]}
SLIM_LENET_PARAMS = (13 * 25 + 13) + (34 * 13 * 25 + 34) + (34 * 16 * 340 + 340) + (340 * 10 + 10)


def n_params(net: nn.Module) -> int:
    return sum(p.numel() for p in net.parameters())


def test_macs_per_sample_counts_the_recipe_layers():
    # conv1 20*24*24*25, conv2 50*8*8*(20*25), fc1 800*500, fc2 500*10
    assert macs_per_sample("lenet", 10, None) == 288_000 + 1_600_000 + 400_000 + 5_000
    assert macs_per_sample("lenet", 10, SLIM_LENET) == 13 * 576 * 25 + 34 * 64 * 13 * 25 + 544 * 340 + 3_400
    assert macs_per_sample("simple_cnn", 10, None) == 16 * 1024 * 27 + 32 * 1024 * 144 + 32 * 1024 * 10


def test_kept_channels_follow_the_floor_without_float_error():
    assert [kept(n, 0.32) for n in (20, 50, 500)] == [13, 34, 340]
    assert kept(100, 0.29) == 71 and kept(3, 0.9) == 1  # 100 * 0.71 is 70.99999999999999 in floats


def removed_channels(before: torch.Tensor, after: torch.Tensor) -> list[int]:
    """Indices of ``before``'s rows missing from ``after`` (rows are compared exactly)."""
    kept_rows = [next(i for i in range(len(before)) if torch.equal(before[i], row)) for row in after]
    return sorted(set(range(len(before))) - set(kept_rows))


def test_slim_removes_the_lowest_norm_channels_and_computes_the_same_function():
    """A slimmed LeNet computes what the dense one computes with the removed channels switched off."""
    torch.manual_seed(0)
    net = LeNet()
    with torch.no_grad():  # make a few channels clearly the weakest by L1 norm
        net.conv1.weight[[3, 7]] *= 0.01
        net.fc1.weight[:5] *= 0.01
        net.fc2.weight[:, :5] *= 0.01
    dense = LeNet()
    dense.load_state_dict(net.state_dict())
    widths = slim(net, {"conv1": 10, "conv2": 25, "fc1": 250}, norm=1)
    assert widths == {"conv1": 10, "conv2": 25, "fc1": 250}
    assert net.widths() == {"channels": [10, 25], "hidden": [250]}
    shapes = {k: tuple(v.shape) for k, v in net.state_dict().items()}
    assert shapes == {
        "conv1.weight": (10, 1, 5, 5),
        "conv1.bias": (10,),
        "conv2.weight": (25, 10, 5, 5),
        "conv2.bias": (25,),
        "fc1.weight": (250, 400),
        "fc1.bias": (250,),
        "fc2.weight": (10, 250),
        "fc2.bias": (10,),
    }
    assert n_params(net) == 109_295
    assert torch.equal(net.fc2.bias, dense.fc2.bias)  # the output layer keeps every class
    gone1 = removed_channels(dense.conv1.weight, net.conv1.weight)
    gone2 = removed_channels(dense.conv2.weight[:, [i for i in range(20) if i not in gone1]], net.conv2.weight)
    columns = [c * 16 + k for c in range(50) if c not in gone2 for k in range(16)]  # fc1 reads conv2 flattened
    gone_fc = removed_channels(dense.fc1.weight[:, columns], net.fc1.weight)
    assert {3, 7} <= set(gone1) and len(gone1) == 10 and len(gone2) == 25 and len(gone_fc) == 250
    assert set(range(5)) <= set(gone_fc)
    with torch.no_grad():  # switch the removed channels off in the dense net: zero output, no contribution
        for layer, gone in ((dense.conv1, gone1), (dense.conv2, gone2), (dense.fc1, gone_fc)):
            layer.weight[gone] = 0
            layer.bias[gone] = 0
    x = torch.randn(4, 1, 28, 28)
    torch.testing.assert_close(net(x), dense(x), rtol=1e-5, atol=1e-5)
    # the slimmed weights are a plain state dict of the smaller shape
    rebuilt = build_net("lenet", 10, net.widths())
    rebuilt.load_state_dict(net.state_dict(), strict=True)
    assert torch.equal(rebuilt(x), net(x))


def test_global_ranking_keeps_the_total_and_simple_cnn_follows_the_flatten():
    torch.manual_seed(0)
    net = SimpleCNN()
    widths = slim(net, 24, norm=2)  # 48 channels in all -> 24, ranked across both convs
    assert sum(widths.values()) == 24 and net.fc.in_features == widths["conv2"] * 32 * 32
    assert net.fc.out_features == 10 and net(torch.randn(2, 3, 32, 32)).shape == (2, 10)


@pytest.mark.slow
def test_slimmed_run_reloads_strictly_everywhere(slimmed_run, tiny_mnist, tmp_path, monkeypatch, capsys):
    """configs/slim.yaml on the tiny MNIST run (the session's ``slimmed_run``, copied: the commands write into it):
    shapes, counts, TensorBoard, and every way back in."""
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "logs" / "tiny" / "version_0"
    shutil.copytree(slimmed_run, run)
    r = results(run)
    assert r["widths"] == SLIM_LENET
    assert (r["params"], r["params_before"]) == (SLIM_LENET_PARAMS, 431_080) and r["nonzero_params"] <= r["params"]
    assert r["macs_per_sample_before"] == 2_293_000
    assert r["macs_per_sample"] == macs_per_sample("lenet", 10, SLIM_LENET) < 0.5 * 2_293_000
    assert r["test_ckpt"] == "final weights" and r["structured_pruning"]["amount"] == 0.32
    assert r["weights_bytes"] < 0.5 * 4 * 431_080 and r["checkpoint_bytes"] > r["weights_bytes"]
    last = run / "checkpoints" / "last.ckpt"
    ckpt = torch.load(last, map_location="cpu", weights_only=True)
    assert ckpt["hyper_parameters"]["widths"] == SLIM_LENET
    # the weights are a plain state dict of the slimmed shape: strictly loadable, same outputs as the module
    net = build_net("lenet", 10, ckpt["hyper_parameters"]["widths"])
    net.load_state_dict({k.removeprefix("net."): v for k, v in ckpt["state_dict"].items()}, strict=True)
    model = ImageClassifier.load_from_checkpoint(last, map_location="cpu")  # no knowledge of pruning needed
    assert model.net.widths() == SLIM_LENET
    x = torch.randn(3, 1, 28, 28)
    with torch.no_grad():
        assert torch.equal(net(x), model.eval()(x))
    # the commands rebuild the run's (dense) config; the whole checkpoint brings its widths, a bare state dict cannot
    cli = cli_for_run(run, [], "test")
    with pytest.raises(ConfigError, match="last.ckpt does not fit model.net=lenet"):
        load_weights(cli, last, ckpt["state_dict"])
    load_weights(cli, last, ckpt)
    assert cli.model.net.widths() == SLIM_LENET
    # evaluate reproduces the run's test accuracy
    assert evaluate.main([str(run), *own_data(run), "--ckpt", "last"]) == 0
    assert json.loads((run / "eval-last-test.json").read_text())["acc"] == r["test_acc"]
    image = tmp_path / "x.png"
    Image.new("L", (28, 28), 200).save(image)
    assert predict.main([str(run), str(image), "--ckpt", "last", "--out", str(tmp_path / "p.csv")]) == 0
    with torch.no_grad():
        from project.data.modules import MNISTDataModule

        expected = int(model(MNISTDataModule().eval_transform()(Image.open(image)).unsqueeze(0)).argmax())
    assert (tmp_path / "p.csv").read_text().splitlines()[1].split(",")[1] == str(expected)
    events = EventAccumulator(str(run), size_guidance={"scalars": 0}).Reload()
    listed = (REPO / "docs" / "run-folder.md").read_text()
    bullet = listed[listed.index("- TensorBoard scalars with structured pruning") :].split("\n- ")[0]
    documented = re.findall(r"`(slim/[a-z_/]+)`", bullet)
    assert len(documented) == 2 and set(documented) <= set(events.Tags()["scalars"])
    params = [e.value for e in events.Scalars("slim/params")]
    assert params == [431_080, SLIM_LENET_PARAMS, SLIM_LENET_PARAMS]  # one per epoch; slimmed at epoch 1
    assert [e.value for e in events.Scalars("slim/width/conv2")] == [50, 34, 34]
    hparams = EventAccumulator(str(run / "hparams")).Reload()  # the HPARAMS tab's metric columns
    assert hparams.Scalars("test/macs_per_sample")[0].value == r["macs_per_sample"]
    assert hparams.Scalars("test/params_before")[0].value == 431_080
    # export writes the slimmed net (about 46 % of the dense weights) and matches it on real test images
    assert export.main([str(run), *own_data(run), "--ckpt", "last", "--repeats", "1"]) == 0
    record = json.loads((run / "export.json").read_text())["onnx"]
    assert record["max_abs_diff"] <= 1e-4 and record["argmax_agree"] == 1.0
    assert record["bytes"] < 0.6 * 4 * 431_080


class Snapshot(L.Callback):
    """The net's weights right after the slimming step and at the end of each epoch, and the optimizer's params."""

    def __init__(self) -> None:
        self.start: dict[int, dict] = {}
        self.end: dict[int, dict] = {}
        self.optimized_ok: list[bool] = []

    def on_train_epoch_start(self, trainer, pl_module):
        self.start[trainer.current_epoch] = {k: v.clone() for k, v in pl_module.net.state_dict().items()}

    def on_train_epoch_end(self, trainer, pl_module):
        self.end[trainer.current_epoch] = {k: v.clone() for k, v in pl_module.net.state_dict().items()}
        params = [p for group in trainer.optimizers[0].param_groups for p in group["params"]]
        self.optimized_ok.append([id(p) for p in params] == [id(p) for p in pl_module.parameters()])


@pytest.mark.slow
def test_training_continues_after_slimming_with_the_schedule_in_place(tiny_mnist, tmp_path, monkeypatch):
    from project.cli.parser import ProjectCLI
    from project.fit import fit

    monkeypatch.chdir(tmp_path)
    cli = ProjectCLI(tiny_args(tiny_mnist, tmp_path / "logs", "--config", SLIM, "--trainer.max_epochs", "3", *STEP_LR))
    snap = Snapshot()
    cli.trainer.callbacks.append(snap)  # after StructuredPruning: sees the slimmed net at epoch start
    r = fit(cli)
    assert snap.optimized_ok == [True, True, True]  # the optimizer holds the slimmed net's parameters
    assert tuple(snap.start[1]["conv2.weight"].shape) == (34, 13, 5, 5)
    for key, value in snap.start[1].items():  # every slimmed tensor is trained in the epoch after the step
        assert not torch.equal(value, snap.end[1][key]), key
    sgd = cli.trainer.optimizers[0]
    assert sgd.param_groups[0]["lr"] == pytest.approx(0.01 * 0.5**3)  # StepLR went on counting through the step
    assert sgd.param_groups[0]["momentum"] == 0.9 and sgd.state  # momentum buffers rebuilt for the new tensors
    assert r["test_acc"] > 0.3  # still learning (chance: 0.1)


def slim_args(paths, logs, epochs, *extra):
    return tiny_args(
        paths,
        logs,
        "--trainer.max_epochs",
        str(epochs),
        *STEP_LR,
        "--trainer.callbacks+=project.callbacks.StructuredPruning",
        "--trainer.callbacks.amount",
        "0.5",
        "--trainer.callbacks.start_epoch",
        "1",
        "--trainer.callbacks.end_epoch",
        "2",
        *extra,
    )


@pytest.mark.slow
def test_resume_mid_schedule_ends_with_the_same_net_bit_for_bit(tiny_mnist, tmp_path, monkeypatch, capsys):
    """Stop after epoch 1 (one of two slimming steps done), resume to 3 epochs: same widths and weights."""
    monkeypatch.chdir(tmp_path)
    assert run_main(slim_args(tiny_mnist, tmp_path / "a", 3)) == 0
    with pytest.warns(UserWarning, match="max_epochs is 2"):
        assert run_main(slim_args(tiny_mnist, tmp_path / "b", 2)) == 0
    (first,) = run_dirs(tmp_path / "b")
    mid = torch.load(first / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert mid["hyper_parameters"]["widths"] == {"channels": [15, 37], "hidden": [375]}  # 25 % removed so far
    mid = shutil.copy(first / "checkpoints" / "last.ckpt", tmp_path / "mid.ckpt")
    assert run_main(slim_args(tiny_mnist, tmp_path / "b", 3, "--ckpt_path", str(first / "checkpoints/last.ckpt"))) == 0
    (straight,), (resumed,) = run_dirs(tmp_path / "a"), run_dirs(tmp_path / "b")
    ra, rb = results(straight), results(resumed)
    assert ra["widths"] == rb["widths"] == {"channels": [10, 25], "hidden": [250]}
    assert rb["params_before"] == ra["params_before"] == 431_080 and rb["params"] == ra["params"] == 109_295
    sa = torch.load(straight / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    sb = torch.load(resumed / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert sa["state_dict"].keys() == sb["state_dict"].keys()
    assert all(torch.equal(sa["state_dict"][k], sb["state_dict"][k]) for k in sa["state_dict"])
    assert rb["test_acc"] == ra["test_acc"] and rb["global_step"] == ra["global_step"] == 30
    assert len(rb["epoch_time_s"]) == 1  # the resume ran one epoch
    # a resume that asks for another schedule, or none, is refused before anything is written
    for extra, expected in (
        (["--trainer.callbacks.amount", "0.4"], "the checkpoint was pruned on the schedule"),
        (["--trainer.callbacks", "[]"], "slimmed by structured pruning"),
    ):
        capsys.readouterr()
        assert run_main(slim_args(tiny_mnist, tmp_path / "c", 3, *extra, "--ckpt_path", str(mid))) == 2
        err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
        assert len(err) == 1 and expected in err[0], err
    assert not (tmp_path / "c").exists()


@pytest.mark.slow
def test_simple_cnn_on_cifar_format_data(tiny_cifar, tmp_path, monkeypatch):
    """configs/cifar10.yaml + configs/slim.yaml on synthetic CIFAR-10 archives: SimpleCNN 16/32 -> 10/21."""
    monkeypatch.chdir(tmp_path)
    args = [
        "--config",
        str(REPO / "configs/cifar10.yaml"),
        "--config",
        SLIM,
        "--data.data_dir",
        str(tiny_cifar["data"]),
        "--data.source_dir",
        str(tiny_cifar["source"]),
        "--data.val_size",
        "100",
        "--data.batch_size",
        "50",
        "--data.eval_batch_size",
        "100",
        "--data.num_workers",
        "0",
        "--data.persistent_workers",
        "false",
        "--trainer.max_epochs",
        "2",
        "--trainer.enable_progress_bar",
        "false",
        "--trainer.logger.init_args.save_dir",
        str(tmp_path / "logs"),
    ]
    assert run_main(args) == 0
    (run,) = run_dirs(tmp_path / "logs")
    r = results(run)
    assert r["widths"] == {"channels": [10, 21]}
    assert r["params"] == (10 * 27 + 10) + (21 * 90 + 21) + (21 * 1024 * 10 + 10) and r["params_before"] == 332_778
    ckpt = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    net = build_net("simple_cnn", 10, ckpt["hyper_parameters"]["widths"])
    net.load_state_dict({k.removeprefix("net."): v for k, v in ckpt["state_dict"].items()}, strict=True)
    assert net.conv1.weight.shape == (10, 3, 3, 3) and net.fc.weight.shape == (10, 21 * 32 * 32)


BAD = [
    (["--trainer.callbacks.amount", "1.0"], "trainer.callbacks.amount: 1.0 is not a PruningAmount"),
    (["--trainer.callbacks.norm", "3"], "trainer.callbacks.norm: invalid value '3'"),
    (["--model.compile", "true"], "model.compile: structured pruning rebuilds the net's layers"),
    (["--trainer.callbacks+=project.callbacks.Pruning"], "trainer.callbacks: StructuredPruning removes channels"),
    (["--model.widths", '{"hidden": [0]}'], "model.widths.hidden: needs 1 positive integer(s), got [0]"),
]


@pytest.mark.parametrize(("extra", "expected"), BAD, ids=[b[1][:40] for b in BAD])
def test_bad_input_is_one_line_and_writes_nothing(extra, expected, tiny_mnist, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    logs = tmp_path / "logs"
    assert run_main(tiny_args(tiny_mnist, logs, "--config", SLIM, "--trainer.max_epochs", "2", *extra)) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(err) == 1 and expected in err[0], err
    assert run_dirs(logs) == []


def test_callback_refuses_bad_settings_when_built_in_python():
    with pytest.raises(ValueError, match=r"structured pruning amount: must be in \[0, 1\), got 1.5"):
        StructuredPruning(amount=1.5)
    with pytest.raises(ValueError, match="end_epoch"):
        StructuredPruning(start_epoch=3, end_epoch=1)
    cb = StructuredPruning(amount=0.6, start_epoch=1, end_epoch=3)
    assert [round(cb.target_at(e), 6) for e in range(5)] == [0.0, 0.2, 0.4, 0.6, 0.6]


@pytest.mark.slow
def test_fashion_mnist_with_the_slim_overlay_through_the_cli(fashion_data, tmp_path):
    """The README's command, shortened: python -m project.fit --config fashion_mnist.yaml --config slim.yaml."""
    proc = run_module(
        [
            "--config",
            str(REPO / "configs/fashion_mnist.yaml"),
            "--config",
            SLIM,
            "--data.data_dir",
            str(fashion_data),
            "--data.num_workers",
            "0",
            "--data.persistent_workers",
            "false",
            "--trainer.limit_train_batches",
            "40",
            "--trainer.limit_val_batches",
            "5",
            "--trainer.limit_test_batches",
            "2",
            "--trainer.enable_progress_bar",
            "false",
        ],
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = run_dirs(tmp_path / "logs")
    r = results(run)
    assert r["widths"] == SLIM_LENET and r["params"] == SLIM_LENET_PARAMS and r["channels_last"] is True
    assert r["test_acc"] > 0.5 and "431,080 -> 200,132" in proc.stdout


def test_model_widths_trains_a_narrow_net_from_scratch(tiny_mnist, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    widths = '{"channels": [13, 34], "hidden": [340]}'
    assert run_main(tiny_args(tiny_mnist, tmp_path / "logs", "--model.widths", widths)) == 0
    (run,) = run_dirs(tmp_path / "logs")
    r = results(run)
    assert r["widths"] == SLIM_LENET and r["params"] == r["params_before"] == SLIM_LENET_PARAMS
    assert r["structured_pruning"] is None
    assert evaluate.main([str(run), *own_data(run)]) == 0  # the run's own config builds this shape
    assert json.loads((run / "eval-best-test.json").read_text())["acc"] == r["test_acc"]


# Every shipped config + overlay combination the README shows (and configs/mnist.yaml + slim.yaml): no schedule
# warning, and with configs/slim.yaml one epoch trains the slimmed net, as docs/usage.md says.
SHIPPED = [
    ("fashion_mnist.yaml", "slim.yaml", []),
    ("mnist.yaml", "slim.yaml", []),
    ("cifar10.yaml", "slim.yaml", ["--trainer.max_epochs", "2"]),  # the README's CIFAR-10 slim runs: 2 epochs
    ("mnist.yaml", "pruning.yaml", ["--trainer.max_epochs", "3"]),
    ("mnist.yaml", "pruning.yaml", []),
    ("fashion_mnist.yaml", "pruning.yaml", []),
]


DOCS_SAY = {  # docs/usage.md, Pruning
    "slim.yaml": "one dense epoch, one fine-tuning the slimmed net; no warning",
    "pruning.yaml": "`configs/pruning.yaml` prunes at the start of epoch 1, so it needs `max_epochs` of 2 or more",
}


def shipped_args(data: dict, logs, base: str, overlay: str, *extra: str) -> list[str]:
    return [
        "--config",
        str(REPO / "configs" / base),
        "--config",
        str(REPO / "configs" / overlay),
        "--data.data_dir",
        str(data["data"]),
        "--data.source_dir",
        str(data["source"]),
        "--data.val_size",
        "100",
        "--data.num_workers",
        "0",
        "--data.persistent_workers",
        "false",
        "--trainer.limit_train_batches",
        "2",
        "--trainer.limit_val_batches",
        "1",
        "--trainer.limit_test_batches",
        "1",
        "--trainer.enable_progress_bar",
        "false",
        "--trainer.logger.init_args.save_dir",
        str(logs),
        *extra,
    ]


def schedule_warnings(caught) -> list[str]:
    return [str(w.message) for w in caught if "max_epochs is" in str(w.message)]


@pytest.mark.slow
@pytest.mark.parametrize(("base", "overlay", "extra"), SHIPPED, ids=lambda x: x if isinstance(x, str) else "")
def test_shipped_overlays_run_their_schedule_without_a_warning(base, overlay, extra, request, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    data = request.getfixturevalue("tiny_cifar" if base.startswith("cifar") else "tiny_mnist")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert run_main(shipped_args(data, tmp_path / "logs", base, overlay, *extra)) == 0
    assert schedule_warnings(caught) == []
    (run,) = run_dirs(tmp_path / "logs")
    if overlay == "slim.yaml":
        widths = [e.value for e in EventAccumulator(str(run)).Reload().Scalars("slim/width/conv1")]
        dense = 20 if base != "cifar10.yaml" else 16
        assert widths == [dense, kept(dense, 0.32)]  # epoch 0 dense, epoch 1 fine-tunes the slimmed net
    usage = " ".join(REPO.joinpath("docs", "usage.md").read_text().split())
    assert DOCS_SAY[overlay] in usage


@pytest.mark.slow
def test_a_run_too_short_for_the_slim_schedule_warns_what_it_reaches(tiny_mnist, tmp_path, monkeypatch):
    """configs/slim.yaml slims at the start of epoch 1: with max_epochs 1 nothing is removed, and the warning says so
    (it said "0 epochs fine-tune the slimmed net" for the shipped max_epochs 2, which fine-tunes one)."""
    monkeypatch.chdir(tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        args = ["fashion_mnist.yaml", "slim.yaml", "--trainer.max_epochs", "1"]
        assert run_main(shipped_args(tiny_mnist, tmp_path / "logs", *args)) == 0
    assert schedule_warnings(caught) == [
        "structured pruning runs to epoch 1 but max_epochs is 1: 0.00 of the channels will be removed (amount 0.32). "
        "Lower start_epoch/end_epoch or raise trainer.max_epochs to 2 or more"
    ]
    (run,) = run_dirs(tmp_path / "logs")
    assert results(run)["widths"] == {"channels": [20, 50], "hidden": [500]}
