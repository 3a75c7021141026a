"""Quiet by default: the run-folder commands print their result and ``error:`` lines, not the libraries' banners
and exporter chatter; a run's event files hold one graph; summarize's labels are short and its legend legible."""

from __future__ import annotations

import hashlib
import logging
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import run_dirs, run_main, tiny_args

# A command run as `python -m project.<command>`, with the tiny data set's extracted files standing for MNIST's
# published ones (the tests' data is not MNIST: its md5 and size tables are patched, here in the child process).
LAUNCH = """
import hashlib, runpy, sys
from pathlib import Path
from project import data
raw = Path(sys.argv.pop(1))
data.RAW_MD5["MNIST"] = {p.name: hashlib.md5(p.read_bytes()).hexdigest() for p in raw.iterdir()}
data.archives.RAW_SIZES["MNIST"] = {p.name: p.stat().st_size for p in raw.iterdir()}
sys.argv = sys.argv[1:]
runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
"""
BANNERS = ("GPU available", "TPU available", "HPU available", "Seed set", "Tip", "LOCAL_RANK", "Automatic Mixed",
           "INFO:", "Warning:")  # fmt: skip


@pytest.fixture(scope="module")
def fitted(tmp_path_factory) -> dict:
    """One finished 2-epoch tiny run, shared by this module: ``{"run": folder, "raw": its extracted data}``."""
    from conftest import make_tiny_mnist

    root = tmp_path_factory.mktemp("quiet")
    with pytest.MonkeyPatch.context() as mp:
        paths = make_tiny_mnist(root / "mnist", mp)
        mp.chdir(root)
        assert run_main(tiny_args(paths, root / "logs", "--trainer.max_epochs", "2")) == 0
    (run,) = run_dirs(root / "logs")
    return {"run": run, "raw": paths["data"] / "MNIST" / "raw", "root": root}


def command(fitted: dict, *args: str) -> tuple[int, list[str]]:
    """Run ``python -m project.<args[0]> args[1:]`` in the run's root; return its status and output lines."""
    proc = subprocess.run([sys.executable, "-c", LAUNCH, str(fitted["raw"]), *args], cwd=fitted["root"],
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    return proc.returncode, (proc.stdout + proc.stderr).splitlines()


def test_run_folder_commands_print_their_result_and_errors_but_no_banner(fitted):
    run, root = fitted["run"], fitted["root"]
    good, bad = root / "good.png", root / "bad.png"
    from PIL import Image

    Image.new("L", (28, 28)).save(good)
    bad.write_bytes(b"not an image")
    cases = [  # the command, its exit status, the start of each line it prints (stdout's, then stderr's), no other
        (("project.evaluate", str(run)), 0, ["test acc "]),
        (("project.predict", str(run), str(good), str(bad), "--out", str(root / "p.csv")), 1,
         ["1 image(s) classified -> ", f"error: {bad}", "error: 1 of 2 inputs could not be read"]),
        (("project.export", str(run)), 0, ["onnx: "]),
        (("project.export", str(run), "--format", "torchscript"), 0, ["torchscript: "]),
        (("project.export", str(run), "--format", "pt2"), 0, ["pt2: "]),
        (("project.evaluate", str(run), "--ckpt", str(root / "none.ckpt")), 2, ["error: "]),
    ]  # fmt: skip
    for args, status, starts in cases:
        code, lines = command(fitted, *args)
        chatter = [line for line in lines if any(b in line for b in BANNERS)]
        assert chatter == [], (args, chatter)
        assert code == status, (args, lines[-5:])
        assert len(lines) == len(starts) and all(line.startswith(s) for line, s in zip(lines, starts)), (args, lines)


def test_export_restores_the_exporters_log_levels(monkeypatch):
    import logging

    from project import export

    logging.getLogger("onnx_ir").setLevel(logging.DEBUG)
    try:
        with export.quiet_exporters():
            assert not logging.getLogger("onnx_ir.passes").isEnabledFor(logging.INFO)
            assert logging.getLogger("onnx_ir.passes").isEnabledFor(logging.WARNING)
        assert logging.getLogger("onnx_ir").level == logging.DEBUG
    finally:
        logging.getLogger("onnx_ir").setLevel(logging.NOTSET)


def graph_events(run: Path) -> dict[str, int]:
    """``{event file (relative to run): number of graph events}`` for every event file under ``run``."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    return {
        str(f.relative_to(run)): sum(e.HasField("graph_def") for e in EventFileLoader(str(f)).Load())
        for f in sorted(run.rglob("events.out.tfevents.*"))
    }


def tensorboard_warnings(logdir: Path, caplog) -> list[str]:
    """What TensorBoard's own reader (an ``EventMultiplexer`` over ``logdir``, as ``tensorboard --logdir`` and
    ``summarize`` load runs) warns about while it loads every run there."""
    from tensorboard.backend.event_processing.plugin_event_multiplexer import EventMultiplexer

    caplog.clear()
    with caplog.at_level(logging.WARNING):
        mux = EventMultiplexer().AddRunsFromDirectory(str(logdir))
        mux.Reload()
    assert mux.Runs()  # it found the runs
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_run_and_its_resume_hold_one_graph_and_tensorboard_reads_them_without_warnings(fitted, tmp_path, caplog,
                                                                                        monkeypatch):  # fmt: skip
    from project import data

    graphs = graph_events(fitted["run"])
    assert sum(graphs.values()) == 1, graphs  # fit and test are two stages (two event files), one graph
    assert len(graphs) <= 3 and len([f for f in graphs if f.startswith("hparams/")]) == 1  # fit, test; HPARAMS
    assert tensorboard_warnings(fitted["run"].parent, caplog) == []
    # a resume adds the stages it runs, and no second graph (a copy of the run: the module's run stays as it is)
    run = tmp_path / "logs" / "tiny" / "version_0"
    shutil.copytree(fitted["run"], run)
    raw = fitted["raw"]
    monkeypatch.setitem(data.RAW_MD5, "MNIST", {p.name: hashlib.md5(p.read_bytes()).hexdigest() for p in raw.iterdir()})
    monkeypatch.setitem(data.archives.RAW_SIZES, "MNIST", {p.name: p.stat().st_size for p in raw.iterdir()})
    monkeypatch.chdir(tmp_path)
    config = (run / "config.yaml").read_text()
    assert str(fitted["run"].parent.parent) in config  # the copy's own folder is given below
    args = ["--config", str(run / "config.yaml"), "--trainer.logger.init_args.save_dir", str(tmp_path / "logs"),
            "--trainer.max_epochs", "3", "--ckpt_path", str(run)]  # fmt: skip
    assert run_main(args) == 0
    graphs = graph_events(run)
    assert len(graphs) > len(graph_events(fitted["run"])) and sum(graphs.values()) == 1, graphs
    assert tensorboard_warnings(run.parent, caplog) == []
