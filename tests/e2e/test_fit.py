"""End-to-end tests of ``python -m project.fit``."""

from __future__ import annotations

import pytest
import torch
from helpers import REPO, results, run_dirs, run_main, run_module, tiny_args
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from project.cli.checks import fastest_precision
from project.module import ImageClassifier
from project.nets import LeNet

RESULT_KEYS = {
    "test_acc",
    "test_loss",
    "best_val_acc",
    "epochs",
    "global_step",
    "train_samples_per_s",
    "epoch_time_s",
    "params",
    "nonzero_params",
    "precision",
    "best_ckpt",
    "log_dir",
    "sparsity",
    "cudnn_enabled",
    "cudnn_benchmark",
    "deterministic",
    "channels_last",
    "compile",
    "test_samples",
}


def test_fit_on_real_fashion_mnist(fashion_data, tmp_path):
    """The README's main command, shortened: real data, 2 epochs of 60 steps, full test set."""
    proc = run_module(
        [
            "--config",
            str(REPO / "configs/fashion_mnist.yaml"),
            "--data.data_dir",
            str(fashion_data),
            "--data.num_workers",
            "0",
            "--trainer.max_epochs",
            "2",
            "--trainer.limit_train_batches",
            "60",
            "--trainer.limit_val_batches",
            "20",
        ],
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = run_dirs(tmp_path / "logs")
    assert run.parent.name == "fashion_mnist"
    r = results(run)
    assert RESULT_KEYS <= set(r)
    assert set(r) == set(readme_result_keys())  # docs/run-folder.md lists every key, and only keys that are there
    assert r["test_acc"] > 0.6  # chance is 0.1
    assert r["test_samples"] == 10_000 and sum(map(sum, r["confusion_matrix"])) == 10_000
    assert (r["epochs"], r["global_step"]) == (2, 120)
    assert r["params"] == r["nonzero_params"] == 431_080
    assert r["precision"] == fastest_precision("auto") and r["sparsity"] == 0.0
    # each epoch is 60 batches of the config's 128 samples; the median of two per-epoch rates is their mean
    t0, t1 = r["epoch_time_s"]
    assert r["train_samples_per_s"] == pytest.approx((60 * 128 / t0 + 60 * 128 / t1) / 2)
    assert 0 < r["best_val_acc"] <= 1
    ckpts = {p.name for p in (run / "checkpoints").iterdir()}
    assert "last.ckpt" in ckpts and len(ckpts) == 2
    assert (run / "config.yaml").is_file()
    assert "test acc" in proc.stdout and "results.json" in proc.stdout

    # the best checkpoint reloads and its weights fit a plain LeNet strictly
    model = ImageClassifier.load_from_checkpoint(r["best_ckpt"], map_location="cpu")
    net = LeNet()
    net.load_state_dict({k.removeprefix("net."): v for k, v in model.state_dict().items() if k.startswith("net.")})

    events = EventAccumulator(str(run), size_guidance={"images": 0, "scalars": 0}).Reload()
    tags = events.Tags()
    tags_expected = ("train/loss", "train/loss_epoch", "train/acc", "val/acc", "val/loss", "test/acc", "test/loss")
    for tag in (*tags_expected, "lr-AdamW"):
        assert tag in tags["scalars"], tag
    assert "test/confusion_matrix" in tags["images"]
    assert len(events.Scalars("val/acc")) == 2
    # Lightning's ThroughputMonitor, every log_every_n_steps (50): FLOPs are LeNet's 13,182,000 per sample
    samples, flops = events.Scalars("train/device/samples_per_sec"), events.Scalars("train/device/flops_per_sec")
    assert [e.step for e in samples] == [e.step for e in flops] and len(samples) == 2
    for s, f in zip(samples, flops, strict=True):
        assert f.value == pytest.approx(13_182_000 * s.value, rel=1e-4)
    assert [e.value for e in events.Scalars("train/epoch_time_s")] == pytest.approx([t0, t1])
    # the HPARAMS session in its own folder, no experiment summary (it would set every run's columns in a logdir)
    assert hparams_tags(run / "hparams") == {"_hparams_/session_start_info", "_hparams_/session_end_info"}
    assert hparams_tags(run) == set()


def readme_result_keys() -> list[str]:
    """The keys docs/run-folder.md's ``results.json`` bullet names."""
    import re

    text = (REPO / "docs" / "run-folder.md").read_text()
    bullet = text[text.index("- `results.json`:") :]
    return re.findall(r"`([a-z_0-9]+)`", bullet[: bullet.index("\n- ")])


def hparams_tags(run) -> set[str]:
    """Tags of the TensorBoard HPARAMS plugin's summaries in a run's event files."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    found = set()
    for path in run.glob("events.out.tfevents.*"):
        for event in EventFileLoader(str(path)).Load():
            for value in event.summary.value:
                if value.metadata.plugin_data.plugin_name == "hparams":
                    found.add(value.tag)
    return found


BAD = [
    (["--model.lrr", "0.1"], "model.lrr"),
    (["--trainer.max_epohcs", "3"], "--trainer.max_epohcs"),
    (["--trainer.max_epochs", "ten"], "trainer.max_epochs: invalid value 'ten'"),
    (["--trainer.precision", "fp16"], "trainer.precision: invalid value 'fp16'"),
    (["--data.batch_size", "0"], "data.batch_size: 0 is not a PositiveInt"),
    (["--data.num_workers", "-1"], "data.num_workers: -1 is not a NonNegativeInt"),
    (["--data.batch_size", "abc"], "data.batch_size: invalid literal for int() with base 10: 'abc'"),
    (["--model.optimizer.init_args.lr", "abc"], "model.optimizer.lr: invalid value 'abc'; expected float"),
    (["--model.optimizer.lr", "-1"], "model.optimizer: Invalid learning rate: -1"),
    (["--model.net", "simple_cnn"], "model.net: simple_cnn takes 3x32x32 images but the data gives 1x28x28"),
    (
        ["--data.val_size", "600"],
        "data.val_size: 600 must be smaller than the 600 training images; set --data.val_size below 600 (e.g. 60",
    ),
    (["--config", "missing.yaml"], "missing.yaml"),
    (["--ckpt_path", "missing.ckpt"], "ckpt_path: missing.ckpt does not exist"),
    (
        ["--trainer.deterministic", "true", "--trainer.benchmark", "true"],
        "trainer.deterministic: true and trainer.benchmark",
    ),
]


@pytest.mark.parametrize(("extra", "expected"), BAD, ids=[b[1][:30] for b in BAD])
def test_bad_input_is_one_line_nonzero_and_writes_nothing(extra, expected, tiny_mnist, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    logs = tmp_path / "logs"
    assert run_main(tiny_args(tiny_mnist, logs, *extra)) != 0
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(err) == 1 and expected in err[0], err
    assert not logs.exists() or run_dirs(logs) == []


def test_lightnings_value_errors_are_bad_config_while_building_too():
    """A ValueError Lightning raises while the CLI builds the Trainer is a bad setting (exit 2, one line), not a
    bug (traceback); a ValueError from anywhere else still is one."""
    import lightning as L

    from project.cli.entry import _exit_status

    with pytest.raises(ValueError, match="barebones") as info:
        L.Trainer(barebones=True, logger=True)
    assert _exit_status(info.value, parsing=True) == 2 and _exit_status(info.value, parsing=False) == 2
    assert _exit_status(ValueError("ours"), parsing=True) is None and _exit_status(ValueError("x"), False) is None


def test_bad_yaml_key_and_bad_checkpoint_file(tiny_mnist, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "typo.yaml").write_text("model:\n  lrr: 0.1\n")
    (tmp_path / "prune.yaml").write_text(
        "trainer:\n  callbacks:\n    - class_path: project.callbacks.Pruning\n      init_args: {amount: 1.5}\n"
    )
    (tmp_path / "data_typo.yaml").write_text("data:\n  init_args:\n    batch_sise: 64\n")
    (tmp_path / "lr.yaml").write_text("model:\n  optimizer:\n    init_args: {lr: fast}\n")
    (tmp_path / "float.yaml").write_text("data:\n  init_args:\n    batch_size: 12.5\n")
    (tmp_path / "junk.ckpt").write_bytes(b"not a checkpoint")
    torch.save({"weights": torch.zeros(2)}, tmp_path / "tensor.ckpt")
    for extra, expected in [
        (["--config", "typo.yaml"], "lrr"),
        (["--config", "data_typo.yaml"], "data.batch_sise: project.data.MNISTDataModule has no such option"),
        (["--config", "lr.yaml"], "model.optimizer.lr: invalid value 'fast'; expected float"),
        (["--config", "float.yaml"], "data.batch_size: 12.5 not an integer (expected PositiveInt)"),
        (["--config", "prune.yaml"], "trainer.callbacks.amount: 1.5 is not a PruningAmount"),
        (["--ckpt_path", "junk.ckpt"], "junk.ckpt is not a readable checkpoint"),
        (["--ckpt_path", "tensor.ckpt"], "tensor.ckpt is not a Lightning training checkpoint"),
    ]:
        assert run_main(tiny_args(tiny_mnist, tmp_path / "logs", *extra)) == 2
        err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
        assert len(err) == 1 and expected in err[0], err
    assert not (tmp_path / "logs").exists() or run_dirs(tmp_path / "logs") == []


def test_missing_data_without_download_or_source(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code = run_main(["--data.data_dir", str(tmp_path / "none"), "--data.download", "false"])
    assert code == 1
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "error: MNIST data not found" in err and "data.source_dir" in err
    assert f"prepare {tmp_path / 'none'} once before training" in lines[0]  # the cluster's prepare step, named
    assert "Data staging" in lines[0] and "## Data staging" in (REPO / "docs/cluster.md").read_text()
    assert run_dirs(tmp_path / "logs") == []


def test_tiny_run_in_process_reaches_above_chance(tiny_mnist, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert run_main(tiny_args(tiny_mnist, tmp_path / "logs", "--trainer.max_epochs", "3")) == 0
    (run,) = run_dirs(tmp_path / "logs")
    r = results(run)
    assert r["test_samples"] == 100
    assert r["test_acc"] > 0.5  # the tiny data set has a learnable stripe per class; chance is 0.1
    assert r["epochs"] == 3 and r["global_step"] == 30


EVIL = """
import os, sys, torch
class Evil:
    def __reduce__(self):
        return (os.system, ("touch " + sys.argv[2],))
torch.save({"state_dict": {}, "loops": {}, "payload": Evil()}, sys.argv[1])
"""


def test_a_crafted_checkpoint_runs_no_code(tiny_mnist, tmp_path, monkeypatch, capsys):
    import subprocess
    import sys

    monkeypatch.chdir(tmp_path)
    evil, marker = tmp_path / "evil.ckpt", tmp_path / "pwned"
    subprocess.run([sys.executable, "-c", EVIL, str(evil), str(marker)], check=True)
    assert run_main(tiny_args(tiny_mnist, tmp_path / "logs", "--ckpt_path", str(evil))) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(err) == 1 and "evil.ckpt" in err[0] and "unsafe" in err[0] and "--trust_checkpoint" in err[0]
    assert not marker.exists()
    assert run_dirs(tmp_path / "logs") == []
