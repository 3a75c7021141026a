"""Flags and pruning, asserted on the real objects during fit."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from helpers import LinearModel, linear_data, results, run_dirs, run_main, tensorboard_hparams, tiny_args
from tiny_data import PRUNING
from torch import nn

from project.callbacks.pruning import Pruning, sparsity
from project.cli.parser import ProjectCLI
from project.fit import fit
from project.module import ImageClassifier
from project.nets import LeNet


def watch(cli: ProjectCLI) -> dict:
    """Record, at every forward of the net during training, the flags and formats in effect."""
    seen: dict = {"autocast": set(), "dtype": set(), "benchmark": set(), "channels_last": set()}

    def pre(module, args):
        if module.training:
            seen["autocast"].add(torch.is_autocast_enabled("cpu"))
            seen["benchmark"].add(torch.backends.cudnn.benchmark)
            seen["channels_last"].add(args[0].is_contiguous(memory_format=torch.channels_last))

    def post(module, args, out):
        if module.training:
            seen["dtype"].add(out.dtype)

    cli.model.net.register_forward_pre_hook(pre)
    cli.model.net.register_forward_hook(post)
    return seen


@pytest.mark.slow
def test_16_mixed_on_cpu_runs_as_bf16_and_says_so(tiny_mnist, tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)
    cli = ProjectCLI(tiny_args(tiny_mnist, tmp_path / "logs", "--trainer.precision", "16-mixed"))
    seen = watch(cli)
    r = fit(cli)
    assert r["precision"] == "bf16-mixed" and r["requested_precision"] == "16-mixed"
    assert seen["autocast"] == {True} and seen["dtype"] == {torch.bfloat16}
    warnings = [rec.message for rec in caplog.records if "not supported on CPU" in rec.getMessage()]
    assert len(warnings) == 1
    (run,) = run_dirs(tmp_path / "logs")
    assert tensorboard_hparams(run)["precision"] == "bf16-mixed"


@pytest.mark.slow
def test_channels_last_reaches_the_batches(tiny_mnist, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cli = ProjectCLI(tiny_args(tiny_mnist, tmp_path / "logs", "--model.channels_last", "true"))
    seen = watch(cli)
    r = fit(cli)
    assert r["channels_last"] is True and seen["channels_last"] == {True}
    assert cli.model.net.conv1.weight.is_contiguous(memory_format=torch.channels_last)


@pytest.mark.slow
@pytest.mark.parametrize(("flag", "expected"), [([], True), (["--trainer.benchmark", "false"], False)])
def test_cudnn_benchmark_is_left_alone_unless_set(flag, expected, tiny_mnist, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", True)
    cli = ProjectCLI(tiny_args(tiny_mnist, tmp_path / "logs", *flag))
    seen = watch(cli)
    r = fit(cli)
    assert seen["benchmark"] == {expected} and r["cudnn_benchmark"] is expected


@pytest.mark.slow
def test_cudnn_enabled_switch(tiny_mnist, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    before = torch.backends.cudnn.enabled
    cli = ProjectCLI(tiny_args(tiny_mnist, tmp_path / "logs", "--cudnn.enabled", str(not before).lower()))
    r = fit(cli)
    assert r["cudnn_enabled"] is (not before)
    assert torch.backends.cudnn.enabled is before  # restored after the run


def pruning_args(paths, logs, epochs, *extra):
    return tiny_args(paths, logs, "--trainer.max_epochs", str(epochs), *PRUNING, *extra)


@pytest.mark.slow
def test_pruning_reaches_amount_and_reloads_into_a_plain_net(pruned_run):
    run = pruned_run
    r = results(run)
    total = 431_080 - (20 + 50 + 500 + 10)  # conv/linear weights, no biases
    assert abs(r["sparsity"] - 0.6) <= 1 / total
    assert r["nonzero_params"] == r["params"] - round(0.6 * total)
    net = LeNet()
    ckpt = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    net.load_state_dict({k.removeprefix("net."): v for k, v in ckpt["state_dict"].items()}, strict=True)
    zeros = sum(int((p == 0).sum()) for n, p in net.named_parameters() if n.endswith("weight"))
    assert zeros == round(0.6 * total)
    # every checkpoint, mid-schedule or final, loads as an ImageClassifier
    for path in (run / "checkpoints").glob("*.ckpt"):
        ImageClassifier.load_from_checkpoint(path, map_location="cpu")


@pytest.mark.slow
def test_pruning_resume_keeps_masks_and_schedule(pruned_run, tiny_mnist, tmp_path, monkeypatch):
    """Stop after epoch 2 (mid-schedule), resume from last.ckpt: same masks and weights as one run (the session's
    ``pruned_run``, trained on the same archives with the same arguments)."""
    monkeypatch.chdir(tmp_path)
    logs_b = tmp_path / "b"
    assert run_main(pruning_args(tiny_mnist, logs_b, 2)) == 0
    (first,) = run_dirs(logs_b)
    mid = torch.load(first / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    masks = next(v for k, v in mid["callbacks"].items() if "Pruning" in k)["masks"]
    assert masks and 0.15 < 1 - float(torch.cat([m.flatten() for m in masks.values()]).mean()) < 0.25
    assert run_main(pruning_args(tiny_mnist, logs_b, 4, "--ckpt_path", str(first / "checkpoints" / "last.ckpt"))) == 0
    straight = pruned_run
    resumed = run_dirs(logs_b)[-1]
    ra, rb = results(straight), results(resumed)
    assert rb["sparsity"] == ra["sparsity"] and rb["global_step"] == ra["global_step"] and rb["epochs"] == 4
    sa = torch.load(straight / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)["state_dict"]
    sb = torch.load(resumed / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)["state_dict"]
    for key in sa:
        assert torch.equal(sa[key] == 0, sb[key] == 0), key  # identical masks
        assert torch.allclose(sa[key], sb[key], atol=1e-6), key


def test_reported_sparsity_is_true_sparsity_on_a_single_linear(tmp_path):
    cb = Pruning(amount=0.2, parameter_names=["weight", "bias"], make_pruning_permanent=True)
    model = LinearModel()
    trainer = L.Trainer(
        max_epochs=1,
        callbacks=[cb],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(model, linear_data())
    zeros = int((model.lin.weight == 0).sum() + (model.lin.bias == 0).sum())
    assert abs(zeros - 0.2 * 66) <= 1
    reported = trainer.callback_metrics
    assert float(reported["sparsity/global"]) == pytest.approx(zeros / 66)
    assert float(reported["sparsity/lin.weight"]) == pytest.approx(int((model.lin.weight == 0).sum()) / 64)
    assert float(reported["sparsity/lin.bias"]) == pytest.approx(int((model.lin.bias == 0).sum()) / 2)


def test_pruning_skips_weights_that_are_not_parameters(tmp_path):
    flag, buf, none = nn.Linear(3, 3), nn.Linear(3, 3), nn.Linear(3, 3)
    for m, value in ((flag, True), (none, None)):
        del m.weight
        m.weight = value
    del buf.weight
    buf.register_buffer("weight", torch.ones(3, 3))
    model = LinearModel(extra=nn.ModuleList([flag, buf, none]))
    cb = Pruning(amount=0.5)
    trainer = L.Trainer(
        max_epochs=1,
        callbacks=[cb],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(model, linear_data())
    assert [(m, n) for m, n in cb._parameters_to_prune] == [(model.lin, "weight")]
    assert int((model.lin.weight == 0).sum()) == 32
    assert flag.weight is True and none.weight is None and torch.equal(buf.weight, torch.ones(3, 3))


def test_sparsity_counts_each_tensor_once():
    t = torch.tensor([0.0, 1.0, 0.0, 2.0])
    s = sparsity([("a", t), ("a_again", t), ("b", torch.zeros(4))])
    assert s["a"] == 0.5 and s["b"] == 1.0 and s["global"] == pytest.approx(6 / 8)


def test_schedule_reaches_target_linearly():
    cb = Pruning(amount=0.6, start_epoch=1, end_epoch=3)
    assert [round(cb.target_at(e), 6) for e in range(5)] == [0.0, 0.2, 0.4, 0.6, 0.6]
    kept = 1.0
    for e in range(5):
        kept *= 1 - cb._step_amount(e)
    assert kept == pytest.approx(0.4)


@pytest.mark.slow
def test_schedule_longer_than_the_run_is_announced(tiny_mnist, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.warns(UserWarning, match=r"max_epochs is 1: sparsity will reach 0.00, not 0.60"):
        assert run_main(pruning_args(tiny_mnist, tmp_path / "logs", 1)) == 0
    (run,) = run_dirs(tmp_path / "logs")
    assert results(run)["sparsity"] == 0.0


def test_a_run_without_pruning_records_a_dense_net(trained_run):
    """No pruning callback: sparsity 0 and no per-layer sparsity, every parameter nonzero, sizes as built."""
    r = results(trained_run)
    assert (r["sparsity"], r["sparsity_per_layer"], r["structured_pruning"]) == (0.0, {}, None)
    assert r["nonzero_params"] == r["params"] == r["params_before"] > 0
    assert r["macs_per_sample"] == r["macs_per_sample_before"] > 0


class KeptWeights(L.Callback):
    """After the callbacks before it (a pruning step) at each epoch start: the largest distance of the kept weights
    (mask 1) of ``lin.weight`` from their initial values, and the sparsity."""

    def on_fit_start(self, trainer, pl_module):
        self.initial, self.rows = pl_module.lin.weight.detach().clone(), []

    def on_train_epoch_start(self, trainer, pl_module):
        lin = pl_module.lin
        orig = getattr(lin, "weight_orig", lin.weight).detach()
        kept = getattr(lin, "weight_mask", torch.ones_like(orig)).bool()
        self.rows.append((float((orig[kept] - self.initial[kept]).abs().max()), float(1 - kept.float().mean())))


@pytest.mark.parametrize("global_pruning", [True, False])
def test_lottery_ticket_resets_the_kept_weights_to_their_initial_values_at_every_step(global_pruning):
    """``lottery_ticket``: after each pruning step of a schedule (epochs 0, 1, 2 to 60 %), every weight still kept
    holds its initial value again (Frankle & Carbin 2019), not only after the first step; after the schedule,
    training moves them."""
    torch.manual_seed(0)
    check = KeptWeights()
    pruning = Pruning(amount=0.6, end_epoch=2, global_pruning=global_pruning, lottery_ticket=True)
    trainer = L.Trainer(
        max_epochs=4,
        callbacks=[pruning, check],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(LinearModel(), linear_data())
    distances, sparsities = zip(*check.rows)
    assert distances[:3] == (0.0, 0.0, 0.0), distances  # every step of the schedule
    assert distances[3] > 0.01  # trained after the last step
    assert sparsities[0] < sparsities[1] < sparsities[2] == pytest.approx(0.6, abs=0.02)
