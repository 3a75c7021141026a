"""Reliability cases: exact resume, honest epoch metrics, divergence, kill -9, DDP on CPU."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import lightning as L
import pytest
import torch
from helpers import REPO, alive, descendants, results, run_dirs, run_main, tiny_args
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tiny_data import tables_site, with_site
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from project.data import MNISTDataModule
from project.module import ImageClassifier

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


def lrs(run) -> dict[int, float]:
    acc = EventAccumulator(str(run), size_guidance={"scalars": 0}).Reload()
    return {e.step: e.value for e in acc.Scalars("lr-SGD")}


# The tests below that are about processes (kill -9, DDP) start ``python -m project.fit`` on the tiny MNIST-format
# data set (tests/tiny_data.py), prepared in this process. Its files are not MNIST's: a child gets the md5 sums to
# check them against from a ``sitecustomize.py`` on its ``PYTHONPATH`` (:func:`child_env`), and so do its DDP ranks.


@pytest.fixture
def tiny_data_dir(tiny_mnist) -> Path:
    """The tiny MNIST data set imported into a data_dir (in this process, whose md5 tables ``tiny_mnist`` patched);
    returns the data_dir."""
    MNISTDataModule(data_dir=str(tiny_mnist["data"]), source_dir=str(tiny_mnist["source"])).prepare_data()
    return tiny_mnist["data"]


def tiny_cli(data_dir: Path, logs: str | Path, *extra: str) -> list[str]:
    """``fit`` arguments for a child on the prepared tiny data (500 train / 100 val / 100 test images, batches of 50:
    10 steps an epoch): :func:`helpers.tiny_args` without ``data.source_dir``, which the child does not need."""
    args = tiny_args({"data": data_dir, "source": ""}, logs, *extra)
    at = args.index("--data.source_dir")
    return args[:at] + args[at + 2 :]


def child(data_dir: Path, args: list[str], script: str | None = None) -> list[str]:
    """The command line of ``python -m project.fit ARGS`` (or ``python -c SCRIPT ARGS``) on the tiny data set in
    ``data_dir``; run it with :func:`child_env` of the same ``data_dir``."""
    return [sys.executable, *(("-c", script) if script else ("-m", "project.fit")), *args]


def child_env(data_dir: Path, **extra: str) -> dict[str, str]:
    """A child's environment: this one, unbuffered output, ``tests/`` on ``PYTHONPATH`` (for the test-only
    callbacks of tests/helpers.py), the tiny data set's md5 tables (:func:`tiny_data.with_site`, which also sets one
    OpenMP thread), and ``extra``."""
    path = os.pathsep.join(filter(None, [str(REPO / "tests"), str(REPO), os.environ.get("PYTHONPATH")]))
    site = tables_site(data_dir.parent / "site", data_dir / "MNIST" / "raw")
    return with_site({**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": path, **extra}, site)


def fit(data_dir: Path, args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """Run ``python -m project.fit ARGS`` on the tiny data set in ``cwd`` (text output), as helpers.run_module does."""
    cmd = child(data_dir, args)
    return subprocess.run(cmd, cwd=cwd, env=child_env(data_dir), capture_output=True, text=True, timeout=600)


@pytest.fixture
def one_thread():
    """One intra-op thread for a run in this process (restored after): on a busy 2-core machine two threads make
    each training step several times slower, and a resume must equal a straight run whatever the count."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_resume_continues_exactly(tiny_mnist, tmp_path, monkeypatch, one_thread):
    monkeypatch.chdir(tmp_path)
    assert run_main(tiny_args(tiny_mnist, tmp_path / "a", "--trainer.max_epochs", "3", *STEP_LR)) == 0
    assert run_main(tiny_args(tiny_mnist, tmp_path / "b", "--trainer.max_epochs", "2", *STEP_LR)) == 0
    (first,) = run_dirs(tmp_path / "b")
    last = first / "checkpoints" / "last.ckpt"
    resume = ["--trainer.max_epochs", "3", "--ckpt_path", str(last), *STEP_LR]
    assert run_main(tiny_args(tiny_mnist, tmp_path / "b", *resume)) == 0
    (straight,) = run_dirs(tmp_path / "a")
    (resumed,) = run_dirs(tmp_path / "b")  # resumed in place: one run folder, one set of curves
    assert resumed == first
    ra, rb = results(straight), results(resumed)
    assert rb["global_step"] == ra["global_step"] == 30
    assert len(rb["epoch_time_s"]) == 1  # exactly one more epoch ran
    assert rb["best_val_acc"] == ra["best_val_acc"]  # the best score survives the resume
    lr_a, lr_b = lrs(straight), lrs(resumed)
    assert sorted(lr_b) == sorted(lr_a) == list(range(30))
    assert all(lr_b[s] == pytest.approx(lr_a[s]) for s in lr_b)
    assert lr_b[20] == pytest.approx(0.01 * 0.5**2)
    wa = torch.load(straight / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)["state_dict"]
    wb = torch.load(resumed / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)["state_dict"]
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert rb["test_acc"] == ra["test_acc"]


class FixedPredictions(nn.Module):
    """Predicts class round(x[0, 0, 0]) with certainty: the input encodes the prediction."""

    input_shape = (1, 28, 28)

    def forward(self, x):
        return nn.functional.one_hot(x[:, 0, 0, 0].round().long(), 10).float() * 10


def test_epoch_accuracy_is_correct_over_total_not_mean_of_batches():
    preds = torch.tensor([1, 2, 3, 4, 5, 6, 7, 8, 0, 0])
    targets = torch.tensor([1, 2, 3, 4, 5, 6, 7, 8, 9, 9])  # batches of 4, 4, 2: 4/4, 4/4, 0/2 correct
    x = preds.float().view(10, 1, 1, 1).expand(10, 1, 28, 28).clone()
    model = ImageClassifier()
    model.net = FixedPredictions()
    trainer = L.Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False)
    (metrics,) = trainer.validate(model, DataLoader(TensorDataset(x, targets), batch_size=4), verbose=False)
    assert metrics["val/acc"] == pytest.approx(8 / 10)  # a mean of batch accuracies would say 2/3


def test_diverging_run_stops_with_a_clear_message(tiny_mnist, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    diverging = ["--model.optimizer.lr", "1e6", "--model.optimizer.momentum", "0.9"]
    code = run_main(tiny_args(tiny_mnist, tmp_path / "logs", *diverging))
    assert code == 1
    (line,) = [x for x in capsys.readouterr().err.splitlines() if x.startswith("error:")]
    assert "training loss became" in line and "global step" in line and "lower the learning rate" in line
    step = int(line.split("global step ")[1].split()[0])
    assert step < 10  # within the first epoch (10 steps)


def test_kill_9_leaves_a_loadable_last_checkpoint_and_resume_matches(tiny_data_dir, tmp_path, monkeypatch, one_thread):
    """SIGKILL a run mid-epoch; last.ckpt is whole; resuming ends where an uninterrupted run ends. The killed run is
    a process of its own; the uninterrupted run and the resume run in this one."""
    monkeypatch.chdir(tmp_path)
    # in-memory batches, AdamW and a one-cycle schedule, as configs/fashion_mnist.yaml trains (state a resume must
    # restore), at a rate that leaves the accuracies below 1
    base = [
        *("--data.in_memory", "true", "--trainer.deterministic", "true", "--trainer.max_epochs", "3"),
        *("--model.optimizer", "torch.optim.AdamW", "--model.optimizer.lr", "0.0002"),
        *("--model.lr_scheduler", "torch.optim.lr_scheduler.OneCycleLR", "--model.lr_scheduler.max_lr", "0.0002"),
    ]
    assert run_main(tiny_cli(tiny_data_dir, "a", *base)) == 0
    # killed at step 15, mid-epoch 1 (10 steps an epoch): at a known point, however fast the machine trains
    killed = tiny_cli(tiny_data_dir, "b", *base, "--trainer.callbacks+=helpers.KillAt")
    proc = subprocess.run(
        child(tiny_data_dir, killed),
        cwd=tmp_path,
        env=child_env(tiny_data_dir, KILL_AT="15"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        timeout=600,
    )
    assert proc.returncode == -signal.SIGKILL
    ckpt_dir = tmp_path / "b" / "tiny" / "version_0" / "checkpoints"
    last = ckpt_dir / "last.ckpt"
    ckpt = torch.load(last, map_location="cpu", weights_only=False)
    assert ckpt["epoch"] in (0, 1) and "state_dict" in ckpt
    assert run_main(tiny_cli(tiny_data_dir, "b", *base, "--ckpt_path", str(last))) == 0
    assert not list(ckpt_dir.glob(".*.tmp"))  # a write cut short by the kill left a temp file: the next save removes it
    ra = results(run_dirs(tmp_path / "a")[0])
    rb = results(run_dirs(tmp_path / "b")[-1])
    assert rb["global_step"] == ra["global_step"] == 30
    assert rb["test_acc"] == pytest.approx(ra["test_acc"], abs=1e-6)
    assert rb["best_val_acc"] == pytest.approx(ra["best_val_acc"], abs=1e-6)
    assert rb["test_loss"] == pytest.approx(ra["test_loss"], abs=1e-6)  # 100 test images: the loss tells runs apart


@pytest.mark.slow
def test_ddp_two_cpu_processes(tiny_data_dir, tmp_path):
    """configs/trainer/ddp_cpu.yaml: two DDP processes on the CPU train one run, each rank its share of the data.
    Rank 0 prepares (and md5-checks) the data, rank 1 (which Lightning starts as ``python -m project.fit``) reads
    it."""
    args = [
        *("--config", str(REPO / "configs/trainer/ddp_cpu.yaml")),
        *("--model.optimizer", "torch.optim.AdamW", "--model.optimizer.lr", "0.005"),  # 5 steps a rank learn it
    ]
    proc = fit(tiny_data_dir, tiny_cli(tiny_data_dir, "logs", *args), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = run_dirs(tmp_path / "logs")
    assert len(runs) == 1
    (run,) = runs
    assert len(list(tmp_path.rglob("results.json"))) == 1
    r = results(run)
    assert r["world_size"] == 2
    assert r["test_samples"] == 100  # every test image once, across both ranks
    assert r["test_acc"] > 0.5
    assert len(list((run / "checkpoints").glob("*.ckpt"))) == 2
    events = list(run.glob("events.out.tfevents.*"))
    assert events and json.loads((run / "results.json").read_text())["epochs"] == 1


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_kill_9_leaves_no_orphan_processes(tiny_data_dir, tmp_path):
    """Loader workers, their fork server and the resource tracker all go when training is killed.

    Was flaky on loaded machines: a worker still unpickling its dataset when training died reached ``worker_init``
    with its server already gone, asked the kernel too late and lived on (with the tracker it keeps open); the
    race itself is tests/data/test_workers.py."""
    args = [
        *("--data.in_memory", "false", "--data.num_workers", "2", "--data.persistent_workers", "true"),
        *("--trainer.max_epochs", "1000"),  # still training when it is killed
    ]
    proc = subprocess.Popen(
        child(tiny_data_dir, tiny_cli(tiny_data_dir, "logs", *args)),
        cwd=tmp_path,
        env=child_env(tiny_data_dir),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 120
    kids: set[int] = set()
    try:
        while time.time() < deadline and proc.poll() is None:
            kids = descendants(proc.pid)
            if len(kids) >= 4:  # resource tracker, fork server, 2 workers
                break
            time.sleep(0.2)
        assert len(kids) >= 4, kids
    finally:
        proc.send_signal(signal.SIGKILL)  # also when the workers never came: no run left training
        proc.wait()
    deadline = time.time() + 30  # the kernel's parent-death signal; a loaded machine schedules it late
    while time.time() < deadline and any(alive(p) for p in kids):
        time.sleep(0.2)
    left = [p for p in kids if alive(p)]
    for p in left:
        os.kill(p, signal.SIGKILL)
    assert left == [], "orphans outlived the training process by 30 s"


BLOCKING_SAVE = """
import sys, time, torch
from pathlib import Path
marker, args = Path(sys.argv[1]), sys.argv[2:]
save, calls = torch.save, []

def blocking_save(obj, f, *a, **k):
    calls.append(1)
    if len(calls) > 1:  # epoch 0 wrote last.ckpt; block inside its next write
        f.write(b"half a checkpoint")
        f.flush()
        marker.touch()
        time.sleep(600)
    return save(obj, f, *a, **k)

torch.save = blocking_save
from project.fit import main
sys.exit(main(args))
"""


def test_kill_during_a_checkpoint_write_keeps_the_previous_last_ckpt(tiny_data_dir, tmp_path, monkeypatch, one_thread):
    """The killed run is a process of its own; the resume runs in this one."""
    marker = tmp_path / "writing"
    # no top-k checkpoints: every write is last.ckpt's, so the one cut short is a write of last.ckpt itself
    limits = ("--trainer.limit_train_batches", "5", "--trainer.max_epochs", "3", "--checkpoint.save_top_k", "0")
    args = tiny_cli(tiny_data_dir, "logs", *limits)
    proc = subprocess.Popen(
        child(tiny_data_dir, [str(marker), *args], BLOCKING_SAVE),
        cwd=tmp_path,
        env=child_env(tiny_data_dir),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.time() + 180
    while not marker.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.1)
    assert marker.exists(), proc.stderr.read().decode()[-2000:] if proc.poll() is not None else "no save blocked"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    (run,) = run_dirs(tmp_path / "logs")
    ckpt = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert ckpt["global_step"] == 5 and ckpt["epoch"] == 0  # the complete checkpoint of epoch 0
    monkeypatch.chdir(tmp_path)
    assert run_main([*args, "--ckpt_path", "last"]) == 0
    assert results(run)["global_step"] == 15
