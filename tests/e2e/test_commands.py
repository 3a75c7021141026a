"""The commands that read a run folder: evaluate, predict, summarize (and ``--ckpt_path last``)."""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
import yaml
from helpers import REPO, own_data, results, run_dirs, run_main, tiny_args
from PIL import Image

from project import evaluate, predict, summarize
from project.summary import plots


class Evil:
    """Unpickled, it runs ``touch MARKER`` (``os.system``): a checkpoint that carries code."""

    def __init__(self, marker) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, ("touch " + self.marker,))


@pytest.fixture
def trained(trained_run, tiny_mnist, tmp_path):
    """A copy of the session's finished 2-epoch tiny run in ``tmp_path/logs`` (the commands write into it); returns
    its run folder. ``tiny_mnist``: the md5 tables of the data it trained on (the same seeded archives)."""
    run = tmp_path / "logs" / "tiny" / "version_0"
    shutil.copytree(trained_run, run)
    return run


def test_evaluate_reproduces_the_runs_test_accuracy(trained, capsys):
    assert evaluate.main([str(trained), *own_data(trained)]) == 0
    out = json.loads((trained / "eval-best-test.json").read_text())
    r = results(trained)
    assert out["acc"] == r["test_acc"] and out["samples"] == 100
    assert out["confusion_matrix"] == r["confusion_matrix"]
    counts = np.array(out["confusion_matrix"]).sum(1)
    per_class = list(out["per_class_acc"].values())
    assert sum(a * n for a, n in zip(per_class, counts)) / counts.sum() == pytest.approx(out["acc"], abs=1e-6)
    # the validation split, the last checkpoint, an override, and the experiment folder standing for its newest run
    assert (
        evaluate.main(
            [
                str(trained.parent),
                *own_data(trained.parent),
                "--ckpt",
                "last",
                "--split",
                "val",
                "--data.batch_size",
                "7",
            ]
        )
        == 0
    )
    val = json.loads((trained / "eval-last-val.json").read_text())
    assert val["samples"] == 100 and 0 <= val["acc"] <= 1
    assert run_dirs(trained.parent.parent) == [trained]  # evaluating wrote no new run


def test_commands_leave_nothing_in_the_working_directory(trained, tmp_path, monkeypatch):
    """evaluate and predict rebuild the run without a logger: no config.yaml in the working directory, and
    predicting on image files needs (and imports) nothing of the data set."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    image = elsewhere / "x.png"
    Image.new("L", (28, 28)).save(image)
    assert evaluate.main([str(trained), *own_data(trained)]) == 0
    missing = tmp_path / "no-data-here"
    assert predict.main([str(trained), str(image), "--data.data_dir", str(missing), "--out", "p.csv"]) == 0
    assert sorted(p.name for p in elsewhere.iterdir()) == ["p.csv", "x.png"] and not missing.exists()


@pytest.mark.parametrize(
    "command",
    ["evaluate", "predict", "export", "summarize", "sweep.study", "benchmarks.bench", "benchmarks.bench_e2e"],
)
def test_a_bad_command_line_is_one_error_line(command, tmp_path, capsys):
    """argparse's usage errors, like every other bad input: one line on stderr naming the problem, exit 2."""
    import importlib

    main = importlib.import_module(command if command.startswith("benchmarks") else f"project.{command}").main
    try:  # evaluate, predict and export hand unknown options to the run's config: the folder is refused first
        code = main([str(tmp_path), "--no_such_option", "1"])
    except SystemExit as e:
        code = e.code
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "--help" in err[0], err


RUN_AS_MAIN = """
import gc, runpy, sys
for command in sys.argv[1:]:
    gc.unfreeze()
    sys.argv = ["x", "no-such-run", "--no_such_option", "1"]
    try:
        runpy.run_module(command if "." in command else f"project.{command}", run_name="__main__")
    except SystemExit as e:
        print(command, e.code, gc.get_freeze_count())
"""


def test_a_command_process_ends_through_exit_with():
    """``python -m project.<command>`` exits with main()'s status, its imports frozen out of the garbage collector
    (``cli.exit_with``): Python's exit scans whatever is not frozen, 2.4 s of a ``fit`` on a 2-core CPU."""
    commands = ["fit", "evaluate", "predict", "export", "benchmarks.bench"]
    out = subprocess.run([sys.executable, "-c", RUN_AS_MAIN, *commands], capture_output=True, text=True, cwd=REPO)
    rows = [line.split() for line in out.stdout.splitlines()]
    assert [r[:2] for r in rows] == [[c, "2"] for c in commands], out.stdout + out.stderr
    assert all(int(r[2]) > 100_000 for r in rows), rows  # torch and Lightning alone hold far more objects


@pytest.mark.parametrize("limit", ["0", "1"])
def test_predict_refuses_a_batch_limit_that_would_leave_inputs_out(limit, trained, tmp_path, capsys):
    """limit_predict_batches 0 crashed and 1 classified one batch of three images without a word."""
    images = []
    for i in range(3):
        images.append(tmp_path / f"x{i}.png")
        Image.new("L", (28, 28)).save(images[-1])
    out = tmp_path / "p.csv"
    args = [str(trained), *map(str, images), "--out", str(out), "--data.batch_size", "1"]
    assert predict.main([*args, "--trainer.limit_predict_batches", limit]) == 2
    err = [x for x in capsys.readouterr().err.splitlines() if x.startswith("error:")]
    assert len(err) == 1 and "trainer.limit_predict_batches" in err[0] and not out.exists(), err


def test_commands_refuse_a_crafted_checkpoint_and_run_no_code(trained, tmp_path, capsys):
    evil, marker = trained / "checkpoints" / "evil.ckpt", tmp_path / "pwned"
    torch.save({"state_dict": {}, "loops": {}, "payload": Evil(marker)}, evil)
    # the copy's config names its own logs folder, as the run's own did (a fit that went ahead would write there)
    config = yaml.safe_load((trained / "config.yaml").read_text())
    config["trainer"]["logger"]["init_args"]["save_dir"] = str(tmp_path / "logs")
    (trained / "config.yaml").write_text(yaml.safe_dump(config))
    image = tmp_path / "x.png"
    Image.new("L", (28, 28)).save(image)
    capsys.readouterr()
    for command in (
        lambda: evaluate.main([str(trained), *own_data(trained), "--ckpt", str(evil)]),
        lambda: evaluate.main([str(evil), *own_data(evil)]),
        lambda: predict.main([str(trained), str(image), "--ckpt", str(evil), "--out", str(tmp_path / "p.csv")]),
        lambda: run_main(["--config", str(trained / "config.yaml"), "--ckpt_path", str(evil)]),
    ):
        assert command() == 2
        err = [x for x in capsys.readouterr().err.splitlines() if x.startswith("error:")]
        assert len(err) == 1 and "evil.ckpt" in err[0] and "unsafe" in err[0], err
    assert not marker.exists() and run_dirs(tmp_path / "logs") == [trained]


def test_predict_matches_the_test_path_and_refuses_hostile_images(trained, tmp_path, capsys):
    from project.data.modules import MNISTDataModule

    dm = MNISTDataModule(data_dir=own_data(trained)[1], val_size=100)  # the data the run trained on
    dm.setup("test")
    images = tmp_path / "images"
    (images / "sub").mkdir(parents=True)
    for i in range(6):
        Image.fromarray(dm.test_set.data[i].numpy(), mode="L").save(images / "sub" / f"{i}.png")
    Image.fromarray(dm.test_set.data[0].numpy(), mode="L").convert("RGB").resize((56, 56)).save(images / "big.jpg")
    (images / "notes.txt").write_text("not an image, not an image suffix: skipped in a folder")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "text.png").write_text("not an image")
    png = (images / "sub" / "0.png").read_bytes()
    (bad / "truncated.png").write_bytes(png[: len(png) // 2])
    Image.new("L", (5000, 5000)).save(bad / "bomb.png")  # 25 M pixels in a tiny file
    out = tmp_path / "preds.csv"
    capsys.readouterr()
    hostile = sorted(map(str, bad.iterdir()))
    code = predict.main([str(trained), str(images), *hostile, "--out", str(out), "--top_k", "3"])
    assert code == 1
    err = [x for x in capsys.readouterr().err.splitlines() if x.startswith("error:")]
    assert len(err) == 4 and all(any(n in e for e in err) for n in ("text.png", "truncated.png", "bomb.png"))
    rows = list(csv.DictReader(out.open()))
    names = [r["path"].rsplit("/", 1)[-1] for r in rows]
    assert names == ["big.jpg", "0.png", "1.png", "2.png", "3.png", "4.png", "5.png"]
    assert set(rows[0]) >= {"pred", "label", "prob", "top1_label", "top3_prob"}
    # the same predictions as the model on the test data path
    from project.checkpoints import load_checkpoint
    from project.cli.commands import cli_for_run
    from project.runs.layout import checkpoint_of

    cli = cli_for_run(trained, own_data(trained), "test")
    cli.model.load_state_dict(load_checkpoint(checkpoint_of(trained, "best"))["state_dict"])
    x = torch.stack([dm.test_set[i][0] for i in range(6)])
    with torch.no_grad():
        expected = cli.model.eval()(x).argmax(1).tolist()
    assert [int(r["pred"]) for r in rows[1:]] == expected
    assert all(float(r["top1_prob"]) >= float(r["top2_prob"]) >= float(r["top3_prob"]) for r in rows)


# short runs for summarize: 2 training steps and 1 validation batch an epoch (the whole test set)
SHORT = ["--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "1"]


def test_summarize_groups_seeds_and_tells_configs_apart(tiny_mnist, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for seed in (1, 2, 3):
        assert run_main(tiny_args(tiny_mnist, tmp_path / "logs", *SHORT, "--seed_everything", str(seed))) == 0
    assert run_main(tiny_args(tiny_mnist, tmp_path / "logs", *SHORT, "--model.optimizer.lr", "0.05")) == 0
    runs_ = run_dirs(tmp_path / "logs")
    accs = [results(r)["test_acc"] for r in runs_[:3]]
    (tmp_path / "logs" / "tiny" / "version_9").mkdir()  # an unfinished run
    capsys.readouterr()
    assert summarize.main([str(tmp_path / "logs")]) == 0
    table = capsys.readouterr().out
    assert "unfinished" in table and table.count("| tiny/version_") == 5
    stats = json.loads((tmp_path / "logs" / "summary.json").read_text())["groups"]
    assert sorted(stats) == ["tiny [model.optimizer.lr=0.0100]", "tiny [model.optimizer.lr=0.0500]"]
    seeds = stats["tiny [model.optimizer.lr=0.0100]"]
    assert seeds["runs"] == 3 and seeds["test_acc"]["n"] == 3 and seeds["epochs"]["mean"] == 1
    assert seeds["test_acc"]["mean"] == pytest.approx(np.mean(accs))
    assert seeds["test_acc"]["std"] == pytest.approx(np.std(accs, ddof=1))
    assert stats["tiny [model.optimizer.lr=0.0500]"]["runs"] == 1
    # --by a short key, CSV on stdout, test accuracy plotted against it
    assert summarize.main([str(tmp_path / "logs"), "--by", "lr", "--format", "csv", "--out", str(tmp_path / "s")]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [(r["group"], r["n"]) for r in rows] == [("lr=0.0100", "3"), ("lr=0.0500", "1")]
    assert float(rows[0]["test_acc_mean"]) == pytest.approx(np.mean(accs))
    written = {p.name for p in (tmp_path / "s").iterdir()}
    assert written >= {
        "summary.md",
        "summary.csv",
        "summary-runs.csv",
        "summary.json",
        "val_acc.png",
        "test_acc_vs_lr.png",
    }
    for png in ("val_acc.png", "test_acc_vs_lr.png"):
        with Image.open(tmp_path / "s" / png) as img:
            assert img.format == "PNG" and img.width > 500
    assert summarize.main([str(tmp_path / "nothing")]) == 2


def test_summarize_reads_the_validation_curve_from_event_files(trained_run):
    """``trained_run``: the session's 2-epoch run, read only."""
    steps, values = plots.val_curves(trained_run)
    assert len(steps) == results(trained_run)["epochs"] == 2  # one point per epoch
    assert steps == sorted(steps) and all(0 <= v <= 1 for v in values)
    assert max(values) == pytest.approx(results(trained_run)["best_val_acc"], abs=1e-6)


def test_trainer_predict_works_on_the_test_set_and_on_files(trained, tmp_path):
    """``Trainer.predict(model, datamodule=dm)``: probabilities whose argmax gives the run's test accuracy."""
    from project.checkpoints import load_checkpoint
    from project.cli.commands import cli_for_run
    from project.runs.layout import checkpoint_of

    cli = cli_for_run(trained, own_data(trained), "test")
    cli.model.load_state_dict(load_checkpoint(checkpoint_of(trained, "best"))["state_dict"])
    probs = torch.cat(cli.trainer.predict(cli.model, datamodule=cli.datamodule))
    assert probs.shape == (100, 10) and probs.dtype == torch.float32
    assert torch.allclose(probs.sum(1), torch.ones(100), atol=1e-5)
    targets = torch.as_tensor(cli.datamodule.test_set.targets)
    assert float((probs.argmax(1) == targets).float().mean()) == pytest.approx(results(trained)["test_acc"], abs=1e-6)
    # image files: the same images as PNGs give the same probabilities, in the order given
    for i in (3, 0):
        Image.fromarray(cli.datamodule.test_set.data[i].numpy(), mode="L").save(tmp_path / f"{i}.png")
    files = cli.datamodule.predict_on([tmp_path / "3.png", tmp_path / "0.png"])
    assert files.refused == [] and len(files) == 2
    from_files = torch.cat(cli.trainer.predict(cli.model, datamodule=cli.datamodule))
    assert torch.allclose(from_files, probs[[3, 0]], atol=1e-5)


@pytest.mark.parametrize("fmt", ["onnx", "torchscript", "pt2"])
def test_export_matches_eager_outputs(trained, fmt, capsys):
    from project import export

    assert export.main([str(trained), *own_data(trained), "--format", fmt, "--repeats", "2"]) == 0
    record = json.loads((trained / "export.json").read_text())[fmt]
    suffix = export.FORMATS[fmt]
    written = trained / f"model-best{suffix}"
    assert record["file"] == str(written.resolve()) and record["bytes"] == written.stat().st_size
    assert 0 < record["gzip_bytes"] < record["bytes"]
    assert record["max_abs_diff"] <= 1e-4 and record["argmax_agree"] == 1.0
    assert record["checked_on"].startswith("100 test images")
    lat = record["latency_ms"]
    assert set(lat) == {"batch_1", "batch_256"} and all(v["exported"] > 0 and v["eager"] > 0 for v in lat.values())
    assert not list(trained.glob(".*tmp*"))  # no temporary left behind


def test_export_of_a_pruned_run_compresses_and_bad_input_is_one_error(pruned_run, tiny_mnist, tmp_path, capsys):
    """``pruned_run``: the session's run pruned to 60 % by its last epoch (copied: export writes into it);
    ``tiny_mnist``: the md5 tables of the data it trained on."""
    from project import export

    run = tmp_path / "logs" / "tiny" / "version_0"
    shutil.copytree(pruned_run, run)
    out = tmp_path / "out" / "lenet.onnx"
    assert export.main([str(run), *own_data(run), "--ckpt", "last", "--out", str(out), "--repeats", "1"]) == 0
    record = json.loads((run / "export.json").read_text())["onnx"]
    assert out.is_file() and record["max_abs_diff"] <= 1e-4
    assert record["gzip_bytes"] < 0.75 * record["bytes"]  # 60 % of the weights are exact zeros
    capsys.readouterr()
    (tmp_path / "empty").mkdir()
    for argv in ([str(tmp_path / "empty")], [str(run), "--out", str(tmp_path)], [str(run), "--format", "tflite"]):
        assert export.main(argv) == 2
        err = [x for x in capsys.readouterr().err.splitlines() if x.startswith("error:") or "error:" in x]
        assert len(err) == 1, err
    # a tolerance onnxruntime's float32 kernels do not meet (they sum in another order): exit 1, nothing written
    assert (
        export.main(
            [str(run), *own_data(run), "--atol", "1e-12", "--out", str(tmp_path / "strict.onnx"), "--repeats", "1"]
        )
        == 1
    )
    assert not (tmp_path / "strict.onnx").exists() and not list(tmp_path.glob(".strict*"))
    assert json.loads((run / "export.json").read_text())["onnx"]["file"] == str(out.resolve())
