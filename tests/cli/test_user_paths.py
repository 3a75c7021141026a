"""``~`` in every path option of every command means the home folder (issue 34), as torchvision reads its ``root``
and as a shell reads an unquoted word: a YAML value (``data_dir: ~/fmnist``) or a quoted argument is never a folder
literally named ``~`` in the working directory."""

from __future__ import annotations

import csv
import json
import shutil

import numpy as np
import pytest
import yaml
from helpers import REPO, results, run_main
from jsonargparse import Namespace
from PIL import Image

from project import evaluate, export, predict, summarize
from project.cli import checks
from project.sweep import study as sweep_study
from project.sweep.storage import expand_user

# tiny_args' run settings, without its folders (those come from ~/exp.yaml here)
TINY = ["--data.val_size", "100", "--data.batch_size", "50", "--model.optimizer", "torch.optim.SGD"]
TINY += ["--model.optimizer.lr", "0.01", "--trainer.enable_progress_bar", "false"]
TINY += ["--trainer.enable_model_summary", "false", "--trainer.logger.init_args.name", "tiny"]


@pytest.fixture
def home(tmp_path, monkeypatch):
    """``$HOME`` in ``tmp_path/home``; the working directory ``tmp_path/work`` (where a literal ``~`` would go)."""
    folder, work = tmp_path / "home", tmp_path / "work"
    folder.mkdir()
    work.mkdir()
    monkeypatch.setenv("HOME", str(folder))
    monkeypatch.chdir(work)
    return folder


def no_tilde_folder(work) -> None:
    assert not list(work.rglob("~*")), sorted(map(str, work.rglob("~*")))


@pytest.fixture
def run_in_home(home, tiny_mnist, tmp_path):
    """A tiny run trained with every fit path option under ``~``: ``--config ~/exp.yaml`` whose YAML says
    ``data_dir: ~/data``, ``source_dir: ~/archives`` and the logger's ``save_dir: ~/logs``, and
    ``--trainer.default_root_dir ~/root`` on the command line. Returns the run folder."""
    shutil.copytree(tiny_mnist["source"], home / "archives")
    experiment = {
        "data": {"init_args": {"data_dir": "~/data", "source_dir": "~/archives"}},
        "trainer": {"logger": {"init_args": {"save_dir": "~/logs"}}},
    }
    (home / "exp.yaml").write_text(yaml.safe_dump(experiment))
    args = ["--data", "project.data.MNISTDataModule", "--config", "~/exp.yaml", *TINY, "--trainer.max_epochs", "1"]
    assert run_main([*args, "--trainer.default_root_dir", "~/root"]) == 0
    run = home / "logs" / "tiny" / "version_0"
    assert (run / "results.json").is_file() and (home / "data" / "MNIST").is_dir()
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert config["data"]["init_args"]["data_dir"] == str(home / "data")  # recorded expanded: it repeats as it ran
    assert config["trainer"]["default_root_dir"] == str(home / "root")
    no_tilde_folder(tmp_path / "work")
    return run


def test_fit_and_resume_read_every_path_option_from_the_home_folder(run_in_home, home, tmp_path, capsys):
    """fit: --config, data_dir, source_dir, the logger's save_dir, default_root_dir (the fixture); --ckpt_path."""
    last = "~/logs/tiny/version_0/checkpoints/last.ckpt"
    capsys.readouterr()
    args = ["--data", "project.data.MNISTDataModule", "--config", "~/exp.yaml", *TINY, "--trainer.max_epochs", "1"]
    args += ["--ckpt_path", last]
    assert run_main(args) == 0
    assert "already finished" in capsys.readouterr().out
    no_tilde_folder(tmp_path / "work")


@pytest.mark.slow
@pytest.mark.parametrize(
    "command, argv, made",
    [
        ("evaluate", ["~/logs/tiny/version_0", "--data.data_dir", "~/data"], "logs/tiny/version_0/eval-best-test.json"),
        (
            "evaluate",
            ["~/logs/tiny", "--ckpt", "~/logs/tiny/version_0/checkpoints/last.ckpt", "--data.data_dir", "~/data"],
            None,
        ),
        ("evaluate", ["~/logs/tiny/version_0/checkpoints/last.ckpt", "--data.data_dir", "~/data"], None),
        ("predict", ["~/logs/tiny/version_0", "~/images", "--out", "~/out/preds.csv"], "out/preds.csv"),
        (
            "export",
            ["~/logs/tiny", "--format", "pt2", "--repeats", "1", "--out", "~/out/m.pt2", "--data.data_dir", "~/data"],
            "out/m.pt2",
        ),
        ("summarize", ["~/logs", "--out", "~/summary", "--no_plots"], "summary/summary.csv"),
    ],
    ids=["evaluate RUN", "evaluate --ckpt FILE", "evaluate ckpt as RUN, data_dir", "predict", "export", "summarize"],
)
def test_a_run_folder_command_reads_and_writes_paths_under_the_home_folder(
    command, argv, made, run_in_home, home, tmp_path
):
    (home / "images").mkdir()
    Image.fromarray(np.zeros((28, 28), np.uint8), mode="L").save(home / "images" / "0.png")
    main = {"evaluate": evaluate, "predict": predict, "export": export, "summarize": summarize}[command].main
    assert main(argv) == 0
    if made:
        assert (home / made).is_file()
    if command == "evaluate":
        name = "eval-last-test.json" if "last" in " ".join(argv) else "eval-best-test.json"
        out = json.loads((run_in_home / name).read_text())
        assert out["samples"] == 100 and out["ckpt"].startswith(str(home))
        if name == "eval-best-test.json":
            assert out["acc"] == results(run_in_home)["test_acc"]
    if command == "predict":
        (row,) = csv.DictReader((home / made).open())
        assert row["path"] == str(home / "images" / "0.png")
    no_tilde_folder(tmp_path / "work")


def test_a_sweep_reads_its_file_storage_and_folder_from_the_home_folder(home, tmp_path, capsys):
    shutil.copy(REPO / "configs/sweeps/smoke.yaml", home / "smoke.yaml")
    # --storage: SQLite creates the database file where the URL says, then finds no study in it
    assert sweep_study.main(["--config", "~/smoke.yaml", "--storage", "sqlite:///~/studies.db", "--report"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: no study 'smoke' in sqlite:///" + str(home)), err
    assert (home / "studies.db").is_file()
    # the sweep folder: the base experiment's save_dir
    argv = ["--config", "~/smoke.yaml", "--report", "--trainer.logger.init_args.save_dir", "~/sweeps"]
    assert sweep_study.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"error: no sweep 'smoke' yet: {home / 'sweeps' / 'smoke' / 'study.db'} does not exist; run it first"
    ]
    no_tilde_folder(tmp_path / "work")


def test_every_path_key_is_expanded_wherever_it_is(home):
    """The walk over a parsed config: data, loggers (one or a list), callbacks, the profiler, the Trainer, fit's and
    the commands' own keys; other values starting with ``~`` and URLs stay as they are."""
    cfg = Namespace(
        data=Namespace(init_args=Namespace(data_dir="~/d", source_dir="~/s", batch_size=8)),
        trainer=Namespace(
            logger=[Namespace(init_args=Namespace(save_dir="~/l")), Namespace(init_args=Namespace(save_dir="s3://b"))],
            callbacks=[Namespace(class_path="x.ModelCheckpoint", init_args=Namespace(dirpath="~/c"))],
            profiler=Namespace(init_args=Namespace(dirpath="~/p", filename="~keep")),
            default_root_dir="~/r",
        ),
        checkpoint=Namespace(dirpath="~/k", filename="~keep"),
        ckpt_path="~/x.ckpt",
        run="~/run",
        ckpt="best",
        out="~/o.csv",
        inputs=["~/a.png", "b.png"],
    )
    checks.settle_user_paths(cfg)
    h = str(home)
    assert cfg.data.init_args.data_dir == f"{h}/d" and cfg.data.init_args.source_dir == f"{h}/s"
    assert [lg.init_args.save_dir for lg in cfg.trainer.logger] == [f"{h}/l", "s3://b"]
    assert cfg.trainer.callbacks[0].init_args.dirpath == f"{h}/c" and cfg.trainer.profiler.init_args.dirpath == f"{h}/p"
    assert cfg.trainer.profiler.init_args.filename == "~keep" and cfg.checkpoint.filename == "~keep"
    assert (cfg.trainer.default_root_dir, cfg.checkpoint.dirpath, cfg.ckpt_path) == (f"{h}/r", f"{h}/k", f"{h}/x.ckpt")
    assert (cfg.run, cfg.ckpt, cfg.out, cfg.inputs) == (f"{h}/run", "best", f"{h}/o.csv", [f"{h}/a.png", "b.png"])
    assert expand_user("sqlite:///~/s.db") == f"sqlite:///{h}/s.db"
    for url in ("sqlite:////abs/s.db", "sqlite:///rel.db", "postgresql://u@h/~db"):
        assert expand_user(url) == url
