"""Quiet by default: the run-folder commands print their result and ``error:`` lines, not the libraries' banners
and exporter chatter; a run's event files hold one graph; summarize's labels are short and its legend legible."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from helpers import own_data, run_main
from PIL import Image
from tiny_data import tables_site, with_site

from project import summarize
from project.summary import collect, labels, plots

BANNERS = (
    "GPU available",
    "TPU available",
    "HPU available",
    "Seed set",
    "Tip",
    "LOCAL_RANK",
    "Automatic Mixed",
    "INFO:",
    "Warning:",
)


@pytest.fixture(scope="module")
def fitted(trained_run) -> dict:
    """The session's finished 2-epoch tiny run (``trained_run``, tests/conftest.py; read it, don't change it):
    ``{"run": its folder, "raw": its extracted data files}``."""
    (_, data_dir) = own_data(trained_run)
    return {"run": trained_run, "raw": Path(data_dir) / "MNIST" / "raw"}


@pytest.fixture(scope="module")
def site(fitted, tmp_path_factory) -> Path:
    """The tiny data set's extracted files stand for MNIST's published ones (the tests' data is not MNIST): the
    commands' processes get their md5 and size tables from this folder's ``sitecustomize.py``."""
    return tables_site(tmp_path_factory.mktemp("site"), fitted["raw"])


def command(site: Path, cwd: Path, *args: str) -> tuple[int, list[str]]:
    """Run ``python -m project.<args[0]> args[1:]`` in ``cwd`` with the tables of ``site``; return its status and
    output lines."""
    proc = subprocess.run(
        [sys.executable, "-m", *args],
        cwd=cwd,
        env=with_site(dict(os.environ), site),
        capture_output=True,
        text=True,
        timeout=600,
    )
    return proc.returncode, (proc.stdout + proc.stderr).splitlines()


@pytest.mark.slow
def test_run_folder_commands_print_their_result_and_errors_but_no_banner(fitted, site, tmp_path):
    """Each command a process of its own, on its own copy of the run (they write into it), up to 3 at a time."""
    good, bad = tmp_path / "good.png", tmp_path / "bad.png"
    Image.new("L", (28, 28)).save(good)
    bad.write_bytes(b"not an image")
    runs = [tmp_path / str(i) / "tiny" / "version_0" for i in range(6)]
    for run in runs:
        shutil.copytree(fitted["run"], run)
    data = own_data(fitted["run"])
    fast = ("--repeats", "1")  # one timed call per latency figure: the same output line
    cases = [  # the command, its exit status, the start of each line it prints (stdout's, then stderr's), no other
        (("project.evaluate", str(runs[0]), *data), 0, ["test acc "]),
        (
            ("project.predict", str(runs[1]), str(good), str(bad), "--out", str(tmp_path / "p.csv")),
            1,
            ["1 image(s) classified -> ", f"error: {bad}", "error: 1 of 2 inputs could not be read"],
        ),
        (("project.export", str(runs[2]), *data, *fast), 0, ["onnx: "]),
        (("project.export", str(runs[3]), *data, *fast, "--format", "torchscript"), 0, ["torchscript: "]),
        (("project.export", str(runs[4]), *data, *fast, "--format", "pt2"), 0, ["pt2: "]),
        (("project.evaluate", str(runs[5]), *data, "--ckpt", str(tmp_path / "none.ckpt")), 2, ["error: "]),
    ]
    with ThreadPoolExecutor(max_workers=3) as pool:
        outputs = list(pool.map(lambda case: command(site, tmp_path, *case[0]), cases))
    for (args, status, starts), (code, lines) in zip(cases, outputs):
        chatter = [line for line in lines if any(b in line for b in BANNERS)]
        assert chatter == [], (args, chatter)
        assert code == status, (args, lines[-5:])
        assert len(lines) == len(starts) and all(line.startswith(s) for line, s in zip(lines, starts)), (args, lines)


def test_export_restores_the_exporters_log_levels():
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


def test_a_run_and_its_resume_hold_one_graph_and_tensorboard_reads_them_without_warnings(
    fitted, tmp_path, caplog, monkeypatch
):
    from project.data import archives

    graphs = graph_events(fitted["run"])
    assert sum(graphs.values()) == 1, graphs  # fit and test are two stages (two event files), one graph
    assert len(graphs) <= 3 and len([f for f in graphs if f.startswith("hparams/")]) == 1  # fit, test; HPARAMS
    assert tensorboard_warnings(fitted["run"].parent, caplog) == []
    # a resume adds the stages it runs, and no second graph (a copy of the run: the module's run stays as it is)
    run = tmp_path / "logs" / "tiny" / "version_0"
    shutil.copytree(fitted["run"], run)
    raw = fitted["raw"]
    monkeypatch.setitem(
        archives.RAW_MD5, "MNIST", {p.name: hashlib.md5(p.read_bytes()).hexdigest() for p in raw.iterdir()}
    )
    monkeypatch.setitem(archives.RAW_SIZES, "MNIST", {p.name: p.stat().st_size for p in raw.iterdir()})
    monkeypatch.chdir(tmp_path)
    config = (run / "config.yaml").read_text()
    assert str(fitted["run"].parent.parent) in config  # the copy's own folder is given below
    args = [
        "--config",
        str(run / "config.yaml"),
        "--trainer.logger.init_args.save_dir",
        str(tmp_path / "logs"),
        "--trainer.max_epochs",
        "3",
        "--ckpt_path",
        str(run),
    ]
    assert run_main(args) == 0
    graphs = graph_events(run)
    assert len(graphs) > len(graph_events(fitted["run"])) and sum(graphs.values()) == 1, graphs
    assert tensorboard_warnings(run.parent, caplog) == []


def test_summarize_reads_a_run_written_with_two_graphs_without_warnings(fitted, tmp_path, caplog):
    """A run from before the graph was written once (two graph events, as every run had) and before metrics.csv:
    summarize reads its validation curve from the event files, and says nothing about the graphs."""
    from project.summary import plots

    old = tmp_path / "old" / "version_0"
    shutil.copytree(fitted["run"], old, ignore=shutil.ignore_patterns("metrics*.csv", "hparams"))
    (first, *_) = sorted(old.glob("events.out.tfevents.*"))
    shutil.copy(first, old / f"{first.name}.again")  # a second stream holding the graph again
    assert sum(graph_events(old).values()) == 2
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        steps, values = plots.val_curves(old)
    assert len(steps) == 4 and len(values) == 4  # 2 epochs, each stream once
    assert [r.getMessage() for r in caplog.records] == []
    assert logging.getLogger("tensorboard").level == logging.NOTSET  # restored


def test_the_banner_loggers_are_off_for_info_and_on_for_warnings():
    """Every logger Lightning prints its set-up banner with, the CUDA one (``LOCAL_RANK: 0 - CUDA_VISIBLE_DEVICES``)
    included, which a CPU machine never reaches."""
    from project.cli.entry import BANNER_LOGGERS, quiet_library_banners

    emitters = [
        "lightning.fabric.utilities.seed",
        "lightning.pytorch.utilities.rank_zero",
        "lightning.fabric.utilities.rank_zero",
        "lightning.pytorch.accelerators.cuda",
        "lightning.pytorch.trainer.connectors.accelerator_connector",
    ]
    saved = {name: logging.getLogger(name).level for name in (*BANNER_LOGGERS, *emitters)}
    try:  # a fresh process's levels (an earlier test may have set any of them)
        for name in saved:
            logging.getLogger(name).setLevel(logging.INFO if name in BANNER_LOGGERS else logging.NOTSET)
        assert all(logging.getLogger(name).isEnabledFor(logging.INFO) for name in emitters)
        with quiet_library_banners():
            assert not any(logging.getLogger(name).isEnabledFor(logging.INFO) for name in emitters)
            assert all(logging.getLogger(name).isEnabledFor(logging.WARNING) for name in emitters)
        assert all(logging.getLogger(name).isEnabledFor(logging.INFO) for name in emitters)  # restored afterwards
    finally:
        for name, level in saved.items():
            logging.getLogger(name).setLevel(level)


def fake_run(folder: Path, i: int, experiment: str = "exp") -> None:
    """A finished run folder as ``fit`` leaves it for ``summarize`` (``config.yaml``, ``results.json``,
    ``metrics.csv``), whose config differs from run ``i + 1``'s in a dozen keys, several of them long."""
    run = folder / experiment / f"version_{i}"
    run.mkdir(parents=True)
    config = {
        "seed_everything": 1,
        "model": {
            "net": ["lenet", "simple_cnn"][i % 2],
            "widths": [8 * (i + 1), 16, 32, 64],
            "optimizer": {
                "class_path": ["torch.optim.SGD", "torch.optim.AdamW"][i % 2],
                "init_args": {"lr": 0.001 * (i + 1), "weight_decay": 1e-4 * (i % 3)},
            },
            "lr_scheduler": {
                "class_path": "torch.optim.lr_scheduler.OneCycleLR",
                "init_args": {"max_lr": 0.01 * (i + 1), "pct_start": 0.1 + 0.01 * i},
            },
        },
        "data": {
            "class_path": "project.data.FashionMNISTDataModule",
            "init_args": {"batch_size": 32 + i, "val_size": 5000 + i, "data_dir": f"/data/{i}"},
        },
        "trainer": {
            "max_epochs": 2 + i % 4,
            "precision": ["32-true", "bf16-mixed"][i % 2],
            "callbacks": [
                {
                    "class_path": "project.callbacks.Pruning",
                    "init_args": {
                        "amount": 0.05 * i,
                        "method": f"l1_unstructured_variant_{i}",
                        "start_epoch": i % 3,
                        "parameter_names": [f"layer{i}.weight"],
                    },
                }
            ],
        },
    }
    import yaml

    (run / "config.yaml").write_text(yaml.safe_dump(config))
    results = {"test_acc": 0.5 + i / 100, "best_val_acc": 0.5, "seed": 1, "epochs": 2, "sparsity": 0.0}
    (run / "results.json").write_text(json.dumps(results))
    (run / "metrics.csv").write_text("epoch,step,val/acc\n0,10,0.5\n1,20,0.6\n")


@pytest.mark.parametrize("groups", [4, 25])
def test_summarize_labels_are_short_and_the_legend_sits_outside_the_plot(groups, tmp_path, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    for i in range(groups):
        fake_run(tmp_path / "logs", i)
    figures = {}
    savefig = plots.save  # every figure summarize writes

    def keep(fig, path, *args, **kwargs):
        figures[Path(path).name] = fig
        return savefig(fig, path, *args, **kwargs)

    monkeypatch.setattr(plots, "save", keep)
    assert summarize.main([str(tmp_path / "logs"), "--out", str(tmp_path / "s")]) == 0
    stats = json.loads((tmp_path / "s" / "summary.json").read_text())["groups"]
    assert len(stats) == groups
    longest = max(stats, key=len)
    assert len(longest) > 300  # the full label: every key that differs, written out
    for name in ("summary.md", "summary.csv"):  # the full labels stay in the tables
        assert all(label in (tmp_path / "s" / name).read_text() for label in stats), name
    fig = figures["val_acc.png"]
    (ax,) = fig.axes
    legend = fig.legends[0] if fig.legends else ax.get_legend()
    texts = [t.get_text() for t in legend.get_texts()]
    assert len(texts) == min(groups, plots.LEGEND_ENTRIES + 1)
    assert all(len(t) <= labels.LABEL_CHARS + len(" (n=1)") for t in texts), max(texts, key=len)
    # keys by their short names, in the config's order; values abbreviated; the ones that do not fit counted
    assert texts[0] == "batch_size=32, val_size=5000, max_lr=0.0100, +12 more (n=1)" and len(set(texts)) == len(texts)
    if groups > plots.LEGEND_ENTRIES:
        assert texts[-1] == f"... {groups - plots.LEGEND_ENTRIES} more groups (summary.md)"
    canvas = FigureCanvasAgg(fig)  # the figure as saved (pyplot detached it from its canvas when closing it)
    canvas.draw()
    renderer = canvas.get_renderer()
    box, axes_box, fig_box = legend.get_window_extent(renderer), ax.get_window_extent(renderer), fig.bbox
    assert not box.overlaps(axes_box), (box, axes_box)  # the legend covers no part of the plot
    assert fig_box.x0 <= box.x0 and box.x1 <= fig_box.x1 and fig_box.y0 <= box.y0 and box.y1 <= fig_box.y1
    assert axes_box.height > 0.5 * fig_box.height  # the plot keeps most of the figure


def test_short_labels_name_only_what_differs_and_stay_within_the_limit():

    def group(**config):
        return [collect.Run(Path("x/version_0"), "exp", {}, config)]

    long = "a" * 200
    groups = {
        "one": group(
            **{
                "model.optimizer": "torch.optim.SGD",
                "model.optimizer.lr": 0.01,
                "data.batch_size": 50,
                "trainer.callbacks.Pruning.method": long,
            }
        ),
        "two": group(
            **{
                "model.optimizer": "torch.optim.AdamW",
                "model.optimizer.lr": 0.01,
                "data.batch_size": 64,
                "trainer.callbacks.Pruning.method": long + "b",
            }
        ),
    }
    short = labels.short_labels(groups)
    assert short["one"] == "batch_size=50, optimizer=SGD, method=aaaaaaaaaaaaaaaaaaa…"
    assert short["two"] == "batch_size=64, optimizer=AdamW, method=aaaaaaaaaaaaaaaaaaa…"
    cut = labels.short_labels(groups, limit=30)
    assert cut == {"one": "batch_size=50, +2 more", "two": "batch_size=64, +2 more"}
    assert labels.short_labels({"one": groups["one"]}) == {"one": "exp"}  # nothing differs: the experiment
    assert labels.short_labels(groups, by=["lr", "batch_size"]) == {"one": "batch_size=50", "two": "batch_size=64"}
