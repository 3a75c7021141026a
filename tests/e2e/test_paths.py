"""Every documented path ends in a correct run or one clear error (issue: resumes, reruns, odd sizes, switches).

Each test names the kind of fault it guards; most run in-process on the tiny MNIST fixture (500 train /
100 val / 100 test images, batch 50 -> 10 steps per epoch).
"""

from __future__ import annotations

import json
import re

import fsspec
import lightning as L
import pytest
import torch
from helpers import ONECYCLE, REPO, results, run_dirs, run_main, tiny_args
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from project.callbacks.pruning import Pruning
from project.data.modules import MNISTDataModule
from project.module import ImageClassifier
from project.nets import LeNet
from project.runs.layout import snapshot


def error_lines(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]


def files_and_bytes(run) -> dict:
    return {p: (t, p.read_bytes()) for p, t in snapshot(run).items()}


# Every switch trains and is recorded: tests/cli/test_cli_input.py::test_every_switch_under_each_auto_precision,
# each switch of helpers.SWITCHES under each precision auto_precision can pick (configs/mnist.yaml sets
# auto_precision, so a plain run of a switch is one of those three; the same assertions, plus the precision).


def test_fast_dev_run_runs_one_batch_and_writes_no_run(tiny_mnist, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert run_main(tiny_args(tiny_mnist, tmp_path / "logs", "--trainer.fast_dev_run", "true")) == 0
    assert run_dirs(tmp_path / "logs") == []  # Lightning's fast_dev_run logs and checkpoints nothing
    assert not (tmp_path / "checkpoints").exists()  # Lightning 2.6's on_train_end saved last.ckpt here
    assert "test acc" in capsys.readouterr().out


@pytest.mark.slow
def test_compile_switch(tiny_mnist, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert run_main(tiny_args(tiny_mnist, tmp_path / "logs", "--model.compile", "true")) == 0
    (run,) = run_dirs(tmp_path / "logs")
    assert results(run)["compile"] is True


# -- the values typed are the values used -----------------------------------------------------------------------
def test_int_limits_are_batches_not_fractions(tiny_mnist, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = tmp_path / "one.yaml"
    cfg.write_text("trainer:\n  limit_train_batches: 1\n  limit_val_batches: 1\n")
    assert (
        run_main(
            tiny_args(tiny_mnist, tmp_path / "cli", "--trainer.limit_train_batches", "1", "--trainer.max_epochs", "2")
        )
        == 0
    )
    assert run_main(tiny_args(tiny_mnist, tmp_path / "yaml", "--config", str(cfg))) == 0
    assert results(run_dirs(tmp_path / "cli")[0])["global_step"] == 2  # 1 step per epoch, not 100 %
    assert results(run_dirs(tmp_path / "yaml")[0])["global_step"] == 1
    # a fraction stays a fraction
    assert run_main(tiny_args(tiny_mnist, tmp_path / "frac", "--trainer.limit_train_batches", "0.5")) == 0
    assert results(run_dirs(tmp_path / "frac")[0])["global_step"] == 5


# -- what docs/run-folder.md says is logged is logged--------------------------------------------------------------
def readme_tags() -> list[str]:
    """The tags docs/run-folder.md's first TensorBoard bullet names."""
    text = (REPO / "docs" / "run-folder.md").read_text()
    bullet = text[text.index("- TensorBoard scalars:") :]
    bullet = bullet[: bullet.index("\n- ")]
    return re.findall(r"`([a-z_]+(?:/[a-z_]+)+|lr-<Optimizer>)`", bullet)


# docs/run-folder.md says: GPUs only / more than one device
NOT_ON_ONE_CPU = {"train/device/mfu", "train/samples_per_sec"}


def test_readme_tags_are_in_the_event_files_and_lr_is_logged_every_step(tiny_mnist, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = [
        "--trainer.max_epochs",
        "3",
        "--trainer.log_every_n_steps",
        "10",
        "--config",
        str(REPO / "configs/pruning.yaml"),
    ]
    assert run_main(tiny_args(tiny_mnist, tmp_path / "logs", *args)) == 0
    (run,) = run_dirs(tmp_path / "logs")
    events = EventAccumulator(str(run), size_guidance={"scalars": 0, "images": 0}).Reload()
    scalars = set(events.Tags()["scalars"])
    tags = readme_tags()
    # (the end-of-run HPARAMS metric tags live in the run's hparams/ session: tests/test_hparams_tab.py)
    assert len(tags) >= 18 and NOT_ON_ONE_CPU <= set(tags)
    for tag in set(tags) - NOT_ON_ONE_CPU:
        tag = tag.replace("lr-<Optimizer>", "lr-SGD")
        assert tag in scalars, tag
    assert [e.step for e in events.Scalars("lr-SGD")] == list(range(30))  # every step
    assert [e.step for e in events.Scalars("train/loss")] == [9, 19, 29]  # every log_every_n_steps
    assert len(events.Scalars("train/loss_epoch")) == 3
    assert len(events.Scalars("test/acc")) == 1


# -- resumes: continue correctly or refuse before touching anything --------------------------------------------
@pytest.fixture
def finished_run(tiny_mnist, tmp_path, monkeypatch, capsys):
    """A finished one-cycle run: (logs folder, run folder, {file: bytes} of the run), output swallowed."""
    monkeypatch.chdir(tmp_path)
    logs = tmp_path / "logs"
    assert run_main(tiny_args(tiny_mnist, logs, *ONECYCLE)) == 0
    (run,) = run_dirs(logs)
    capsys.readouterr()
    return logs, run, files_and_bytes(run)


def test_resume_that_would_break_the_schedule_is_refused_untouched(finished_run, tiny_mnist, capsys):
    logs, run, before = finished_run
    args = tiny_args(tiny_mnist, logs, *ONECYCLE, "--trainer.max_epochs", "2", "--ckpt_path", "last")
    assert run_main(args) == 2
    (err,) = error_lines(capsys)
    assert "trainer.max_epochs 1 -> 2" in err and "start a new run" in err
    assert files_and_bytes(run) == before and run_dirs(logs) == [run]


def test_resume_of_a_finished_run_changes_nothing(finished_run, tiny_mnist, capsys):
    logs, run, before = finished_run
    for spec in ("last", str(run), str(run / "checkpoints" / "last.ckpt")):
        assert run_main(tiny_args(tiny_mnist, logs, *ONECYCLE, "--ckpt_path", spec)) == 0
        assert "already finished" in capsys.readouterr().out
    assert files_and_bytes(run) == before and run_dirs(logs) == [run]


def test_resume_keeps_the_original_config_and_adds_its_own(tiny_mnist, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    logs = tmp_path / "logs"
    assert run_main(tiny_args(tiny_mnist, logs)) == 0
    (run,) = run_dirs(logs)
    original = (run / "config.yaml").read_text()
    assert run_main(tiny_args(tiny_mnist, logs, "--trainer.max_epochs", "2", "--ckpt_path", "last")) == 0
    assert (run / "config.yaml").read_text() == original and "max_epochs: 1" in original
    assert "max_epochs: 2" in (run / "config-resume-1.yaml").read_text()
    assert results(run)["global_step"] == 20 and run_dirs(logs) == [run]


def test_resume_with_another_net_is_refused(tiny_cifar, tiny_mnist, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    logs = tmp_path / "logs"
    assert run_main(tiny_args(tiny_mnist, logs)) == 0
    (run,) = run_dirs(logs)
    capsys.readouterr()
    cifar = [
        "--data",
        "project.data.CIFAR10DataModule",
        "--data.data_dir",
        str(tiny_cifar["data"]),
        "--data.source_dir",
        str(tiny_cifar["source"]),
        "--model.net",
        "simple_cnn",
    ]
    args = [*tiny_args(tiny_mnist, logs), *cifar, "--trainer.max_epochs", "2", "--ckpt_path", "last"]
    assert run_main(args) == 2
    (err,) = error_lines(capsys)
    assert "holds a different net" in err
    assert not (run / "config-resume-1.yaml").exists()


def test_no_run_to_resume_is_one_error(tiny_mnist, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert run_main(tiny_args(tiny_mnist, tmp_path / "logs", "--ckpt_path", "last")) == 2
    (err,) = error_lines(capsys)
    assert "no run with checkpoints" in err


# -- degenerate sizes and Lightning's own refusals: one line, nothing written -----------------------------------
DEGENERATE = [
    (["--data.val_size", "590", "--trainer.benchmark", "true"], "give no training batch"),
    (["--data.val_size", "590", "--trainer.benchmark", "true", *ONECYCLE], "give no training batch"),
    (["--trainer.limit_train_batches", "0"], "trains nothing"),
    (["--data.val_size", "0"], "data.val_size: 0 leaves no validation images"),
    (["--data.val_size", "600"], "data.val_size: 600 must be smaller than the 600 training images"),
    (["--data.batch_size", "600", "--trainer.benchmark", "true"], "give no training batch"),
    (["--trainer.val_check_interval", "100"], "val_check_interval"),
    # Trainer values Lightning took unchecked (ZeroDivisionError, IndexError, or another key's name)
    (["--trainer.val_check_interval", "0"], "trainer.val_check_interval: 0 is out of range"),
    (["--trainer.check_val_every_n_epoch", "0"], "trainer.check_val_every_n_epoch: 0 is out of range"),
    (["--trainer.accumulate_grad_batches", "0"], "trainer.accumulate_grad_batches: 0 is out of range"),
    (["--trainer.accumulate_grad_batches", "-1"], "trainer.accumulate_grad_batches: -1 is out of range"),
    (["--trainer.limit_test_batches", "0"], "trainer.limit_test_batches: 0 is out of range"),
    (["--trainer.limit_test_batches", "0.0"], "trainer.limit_test_batches: 0.0 is out of range"),
    (["--trainer.gradient_clip_val", "-1"], "trainer.gradient_clip_val: -1"),
    (["--trainer.num_sanity_val_steps", "-2"], "trainer.num_sanity_val_steps: -2 is out of range"),
    (["--trainer.barebones", "true"], "trainer.barebones: true turns off self.log"),
    (["--trainer.max_epochs", "0"], "trainer.max_epochs: 0 trains nothing"),
    (["--trainer.max_steps", "0"], "trainer.max_steps: 0 trains nothing"),
    (["--trainer.max_epochs", "-1", *ONECYCLE], "OneCycleLR is sized by the run's length"),
    (["--ckpt_path", "last", "--trainer.enable_checkpointing", "false"], "trainer.enable_checkpointing: false with"),
]


@pytest.mark.parametrize(("extra", "expected"), DEGENERATE, ids=[" ".join(d[0])[:40] for d in DEGENERATE])
def test_degenerate_sizes_are_one_error_and_leave_nothing(extra, expected, tiny_mnist, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    logs = tmp_path / "logs"
    assert run_main(tiny_args(tiny_mnist, logs, *extra)) != 0
    errors = error_lines(capsys)
    assert len(errors) == 1 and expected in errors[0], errors
    assert not logs.exists() or list(logs.rglob("*")) == [] or run_dirs(logs) == []


# -- pruning behaves like a Lightning callback ------------------------------------------------------------------
def tiny_trainer(tmp_path, callbacks, epochs, **kw):
    return L.Trainer(
        default_root_dir=tmp_path,
        max_epochs=epochs,
        callbacks=callbacks,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=1,
        deterministic=True,
        **kw,
    )


def tiny_data(tiny_mnist):
    return MNISTDataModule(
        data_dir=str(tiny_mnist["data"]), source_dir=str(tiny_mnist["source"]), val_size=100, batch_size=50
    )


def test_several_pruning_callbacks_run_in_one_trainer(tiny_mnist, tmp_path):
    callbacks = [Pruning(amount=0.3, global_pruning=False), Pruning(amount=0.2, parameter_names=["bias"])]
    trainer = tiny_trainer(tmp_path, callbacks, 1)
    model = ImageClassifier()
    trainer.fit(model, datamodule=tiny_data(tiny_mnist))
    path = tmp_path / "two.ckpt"
    trainer.save_checkpoint(path)
    ckpt = torch.load(path, weights_only=True)
    assert {callbacks[0].state_key, callbacks[1].state_key} <= set(ckpt["callbacks"])
    LeNet().load_state_dict({k.removeprefix("net."): v for k, v in ckpt["state_dict"].items()}, strict=True)
    fc1 = ckpt["state_dict"]["net.fc1.weight"]
    assert float((fc1 == 0).float().mean()) == pytest.approx(0.3, abs=1e-3)  # per layer


@pytest.mark.parametrize("permanent", [False, True])
def test_every_checkpoint_loads_strictly_and_resumes_with_its_masks(permanent, tiny_mnist, tmp_path):
    def pruning():
        return Pruning(amount=0.5, start_epoch=0, end_epoch=1, make_pruning_permanent=permanent)

    # pruning steps at epoch ends: 2 training batches an epoch are enough
    trainer = tiny_trainer(tmp_path, [pruning()], 1, limit_train_batches=2)
    trainer.fit(ImageClassifier(), datamodule=tiny_data(tiny_mnist))
    path = tmp_path / "mid.ckpt"
    trainer.save_checkpoint(path)  # mid-schedule: 0.25 of 0.5 pruned
    model = ImageClassifier.load_from_checkpoint(path, map_location="cpu", weights_only=True)  # strict
    zeros_mid = {f"net.{n}": p == 0 for n, p in model.net.named_parameters() if n.endswith("weight")}
    assert sum(int(z.sum()) for z in zeros_mid.values()) > 0.24 * sum(z.numel() for z in zeros_mid.values())
    resumed = tiny_trainer(tmp_path, [cb := pruning()], 2, limit_train_batches=2)
    model2 = ImageClassifier()
    resumed.fit(model2, datamodule=tiny_data(tiny_mnist), ckpt_path=path, weights_only=True)
    weights = {n: p for n, p in cb.named_targets()}
    for name, zero in zeros_mid.items():
        assert bool((weights[name][zero] == 0).all()), name  # the earlier mask is kept
    total = sum(w.numel() for w in weights.values())
    assert sum(int((w == 0).sum()) for w in weights.values()) == pytest.approx(0.5 * total, abs=2)


# -- checkpoints on a URL land on that filesystem ---------------------------------------------------------------
def test_checkpoint_dirpath_on_a_url(tiny_mnist, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    url = "memory://ckpts/tiny"
    short = ["--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "1"]
    assert run_main(tiny_args(tiny_mnist, tmp_path / "logs", *short, "--checkpoint.dirpath", url)) == 0
    fs = fsspec.filesystem("memory")
    names = {p.rsplit("/", 1)[-1] for p in fs.ls("/ckpts/tiny", detail=False)}
    assert "last.ckpt" in names and len(names) == 2
    assert not (tmp_path / "memory:").exists()
    r = results(run_dirs(tmp_path / "logs")[0])
    assert r["best_ckpt"].startswith("memory://")
    with fs.open(r["best_ckpt"], "rb") as f:
        assert "state_dict" in torch.load(f, weights_only=True)
    json.dumps(r)


# -- the tuned configs run the fast path they declare -----------------------------------------------------------
@pytest.mark.parametrize("config", ["mnist", "fashion_mnist", "cifar10"])
def test_tuned_configs_use_their_fast_path(config, tiny_mnist, tiny_cifar, tmp_path, monkeypatch):
    from project.cli.checks import fastest_precision

    monkeypatch.chdir(tmp_path)
    paths = tiny_cifar if config == "cifar10" else tiny_mnist
    args = [
        "--config",
        str(REPO / f"configs/{config}.yaml"),
        "--data.data_dir",
        str(paths["data"]),
        "--data.source_dir",
        str(paths["source"]),
        "--data.val_size",
        "100",
        "--data.batch_size",
        "50",
        "--trainer.max_epochs",
        "1",
        "--trainer.limit_train_batches",
        "2",
        "--trainer.enable_progress_bar",
        "false",
        "--trainer.logger.init_args.save_dir",
        str(tmp_path / "logs"),
    ]
    assert run_main(args) == 0
    (run,) = run_dirs(tmp_path / "logs")
    assert run.parent.name == config
    r = results(run)
    assert (r["in_memory"], r["channels_last"], r["auto_precision"], r["fused_optimizer"]) == (True, True, True, True)
    assert r["precision"] == fastest_precision("auto") and r["requested_precision"] == r["precision"]
    # an explicit precision wins over the automatic choice
    assert run_main([*args, "--trainer.precision", "32-true"]) == 0
    assert results(run_dirs(tmp_path / "logs")[-1])["precision"] == "32-true"
