"""The commands that read a run folder: evaluate, predict, summarize (and ``--ckpt_path last``)."""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from helpers import results, run_dirs, run_main, tiny_args
from PIL import Image

from project import evaluate, predict, summarize

EVIL = """
import os, sys, torch
class Evil:
    def __reduce__(self):
        return (os.system, ("touch " + sys.argv[2],))
torch.save({"state_dict": {}, "loops": {}, "payload": Evil()}, sys.argv[1])
"""


@pytest.fixture
def trained(tiny_mnist, tmp_path, monkeypatch):
    """A finished 3-epoch tiny run; returns its run folder."""
    monkeypatch.chdir(tmp_path)
    assert run_main(tiny_args(tiny_mnist, tmp_path / "logs", "--trainer.max_epochs", "3")) == 0
    (run,) = run_dirs(tmp_path / "logs")
    return run


def test_evaluate_reproduces_the_runs_test_accuracy(trained, capsys):
    assert evaluate.main([str(trained)]) == 0
    out = json.loads((trained / "eval-best-test.json").read_text())
    r = results(trained)
    assert out["acc"] == r["test_acc"] and out["samples"] == 100
    assert out["confusion_matrix"] == r["confusion_matrix"]
    counts = np.array(out["confusion_matrix"]).sum(1)
    per_class = list(out["per_class_acc"].values())
    assert sum(a * n for a, n in zip(per_class, counts)) / counts.sum() == pytest.approx(out["acc"], abs=1e-6)
    # the validation split, the last checkpoint, an override, and the experiment folder standing for its newest run
    assert evaluate.main([str(trained.parent), "--ckpt", "last", "--split", "val", "--data.batch_size", "7"]) == 0
    val = json.loads((trained / "eval-last-val.json").read_text())
    assert val["samples"] == 100 and 0 <= val["acc"] <= 1
    assert run_dirs(trained.parent.parent) == [trained]  # evaluating wrote no new run


def test_commands_refuse_a_crafted_checkpoint_and_run_no_code(trained, tmp_path, capsys):
    evil, marker = trained / "checkpoints" / "evil.ckpt", tmp_path / "pwned"
    subprocess.run([sys.executable, "-c", EVIL, str(evil), str(marker)], check=True)
    image = tmp_path / "x.png"
    Image.new("L", (28, 28)).save(image)
    capsys.readouterr()
    for command in (
        lambda: evaluate.main([str(trained), "--ckpt", str(evil)]),
        lambda: evaluate.main([str(evil)]),
        lambda: predict.main([str(trained), str(image), "--ckpt", str(evil), "--out", str(tmp_path / "p.csv")]),
        lambda: run_main(["--config", str(trained / "config.yaml"), "--ckpt_path", str(evil)]),
    ):
        assert command() == 2
        err = [x for x in capsys.readouterr().err.splitlines() if x.startswith("error:")]
        assert len(err) == 1 and "evil.ckpt" in err[0] and "unsafe" in err[0], err
    assert not marker.exists()


def test_predict_matches_the_test_path_and_refuses_hostile_images(trained, tiny_mnist, tmp_path, capsys):
    from project.data import MNISTDataModule

    dm = MNISTDataModule(data_dir=str(tiny_mnist["data"]), val_size=100)
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
    from project.cli import cli_for_run
    from project.runs import checkpoint_of, load_checkpoint

    cli = cli_for_run(trained, [], "test")
    cli.model.load_state_dict(load_checkpoint(checkpoint_of(trained, "best"))["state_dict"])
    x = torch.stack([dm.test_set[i][0] for i in range(6)])
    with torch.no_grad():
        expected = cli.model.eval()(x).argmax(1).tolist()
    assert [int(r["pred"]) for r in rows[1:]] == expected
    assert all(float(r["top1_prob"]) >= float(r["top2_prob"]) >= float(r["top3_prob"]) for r in rows)


def test_summarize_means_and_stds_over_seeds(tiny_mnist, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for seed in (1, 2, 3):
        assert run_main(tiny_args(tiny_mnist, tmp_path / "logs", "--seed_everything", str(seed))) == 0
    accs = [results(r)["test_acc"] for r in run_dirs(tmp_path / "logs")]
    (tmp_path / "logs" / "tiny" / "version_9").mkdir()  # an unfinished run
    capsys.readouterr()
    assert summarize.main([str(tmp_path / "logs"), "--out", str(tmp_path / "s.md")]) == 0
    table = capsys.readouterr().out
    assert "unfinished" in table and table.count("| tiny | version_") == 4
    stats = json.loads((tmp_path / "s.json").read_text())["tiny"]
    assert stats["runs"] == 3 and stats["test_acc"]["n"] == 3
    assert stats["test_acc"]["mean"] == pytest.approx(np.mean(accs))
    assert stats["test_acc"]["std"] == pytest.approx(np.std(accs, ddof=1))
    assert summarize.main([str(tmp_path / "nothing")]) == 2
