"""TensorBoard as a user opens it: a server on 127.0.0.1 over a short run, read through its HTTP data API."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
from helpers import REPO, run_dirs, run_main, tiny_args


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str, body: dict | None = None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"} if data else {})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


@pytest.fixture
def tensorboard(tiny_mnist, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = [
        "--trainer.max_epochs",
        "2",
        "--trainer.log_every_n_steps",
        "5",
        "--config",
        str(REPO / "configs/pruning.yaml"),
        *("--trainer.logger.init_args.log_graph", "true"),  # the README's graph tab
    ]
    assert run_main(tiny_args(tiny_mnist, tmp_path / "logs", *args)) == 0
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tensorboard.main",
            "--logdir",
            str(tmp_path / "logs"),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--load_fast",
            "false",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            if get(f"{base}/data/plugin/scalars/tags"):
                break
        except OSError:
            time.sleep(0.5)
    try:
        yield base, run_dirs(tmp_path / "logs")[0]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.slow
def test_dashboards_hold_what_the_readme_promises(tensorboard):
    base, run = tensorboard
    name = f"{run.parent.name}/{run.name}"
    scalars = get(f"{base}/data/plugin/scalars/tags")[name]
    for tag in (
        "train/loss",
        "train/loss_epoch",
        "train/acc",
        "val/loss",
        "val/acc",
        "test/acc",
        "lr-SGD",
        "train/device/samples_per_sec",
        "train/device/flops_per_sec",
        "train/epoch_time_s",
        "sparsity/global",
        "test/class_acc/9_-_nine",
    ):
        assert tag in scalars, tag
    assert len([t for t in scalars if t.startswith("test/class_acc/")]) == 10
    # TIME SERIES sorts groups by name: no `epoch` staircase and no group of single dots ahead of the curves
    assert "epoch" not in scalars and not [t for t in scalars if t.startswith("hp/")]
    layout = get(f"{base}/data/plugin/custom_scalars/layout")
    charts = {c["title"]: c["multiline"]["tag"] for cat in layout["category"] for c in cat["chart"]}
    assert charts["Loss (train, val; per epoch)"] == ["train/loss_epoch", "val/loss"]
    assert charts["Accuracy (train, val; per epoch)"] == ["train/acc", "val/acc"]
    assert "Sparsity (global, per layer)" in charts and "Learning rate" in charts
    experiment = get(f"{base}/data/plugin/hparams/experiment", {"experimentName": ""})
    columns = {h["name"]: h for h in experiment["hparamInfos"]}
    assert {
        "net",
        "optimizer",
        "lr",
        "lr_scheduler",
        "batch_size",
        "max_epochs",
        "precision",
        "in_memory",
        "channels_last",
        "pruning",
        "pruning_amount",
        "seed",
        "dataset",
    } <= set(columns)
    assert not [c for c in columns if c.startswith("_") or "/" in c]  # no internal keys
    assert columns["in_memory"]["type"] == "DATA_TYPE_BOOL" and columns["lr"]["type"] == "DATA_TYPE_FLOAT64"
    # TensorBoard builds the columns from the runs' sessions (no run declares them for all): one run, nothing differs
    assert not [c for c, h in columns.items() if h.get("differs")]
    metrics = {m["name"]["tag"] for m in experiment["metricInfos"]}
    assert {"test/acc", "val/best_acc", "test/sparsity", "test/nonzero_params", "train/mean_samples_per_s"} <= metrics
    images = get(f"{base}/data/plugin/images/tags")[name]
    assert {"test/confusion_matrix", "test/misclassified"} <= set(images)
    pr = get(f"{base}/data/plugin/pr_curves/tags")[name]
    assert len([t for t in pr if t.startswith("test/pr/")]) == 10
    graphs = get(f"{base}/data/plugin/graphs/info")
    assert name in graphs and graphs[name]["run_graph"]
