"""``metrics.csv``: every run folder's per-epoch record, written as the run goes, kept across a resume, and what
``summarize`` reads instead of TensorBoard's event files."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import pytest
from helpers import run_dirs, run_main, tiny_args
from lightning.pytorch.callbacks import Callback
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from project.runs import layout
from project.summary import plots


class Snapshot(Callback):
    """Copies the run's ``metrics.csv`` to ``metrics-at-step-12.csv`` at training step 12 (in epoch 1 of 10-step
    epochs): what a run killed at that moment leaves behind."""

    def on_train_batch_end(self, trainer, *args, **kwargs):
        if trainer.global_step == 12:
            run = Path(trainer.logger.log_dir)
            shutil.copy(run / "metrics.csv", run / "metrics-at-step-12.csv")


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.slow
def test_metrics_csv_has_a_row_per_epoch_written_as_the_run_goes_and_kept_on_resume(tiny_mnist, tmp_path):
    logs = tmp_path / "logs"
    assert (
        run_main(
            tiny_args(tiny_mnist, logs, "--trainer.max_epochs", "2", "--trainer.callbacks+=test_metrics_csv.Snapshot")
        )
        == 0
    )
    (run,) = run_dirs(logs)
    rows = read_csv(run / "metrics.csv")
    assert [(r["epoch"], r["step"]) for r in rows] == [("0", "9"), ("1", "19")]  # 500 images / 50 per batch, from 0
    for key in ("train/acc", "train/loss_epoch", "val/acc", "val/loss", "train/epoch_time_s"):
        assert all(0 <= float(r[key]) < 10 for r in rows), key
    midway = read_csv(run / "metrics-at-step-12.csv")
    assert [r["epoch"] for r in midway] == ["0"] and midway[0] == rows[0]  # epoch 0 on disk during epoch 1
    acc = EventAccumulator(str(run), size_guidance={"scalars": 0})
    acc.Reload()
    tb = [e.value for e in acc.Scalars("val/acc")]
    assert [float(r["val/acc"]) for r in rows] == pytest.approx(tb, rel=1e-6)  # the values TensorBoard has
    old = tmp_path / "old" / "version_0"  # a run from before metrics.csv: summarize falls back to its event files
    shutil.copytree(run, old, ignore=shutil.ignore_patterns("metrics*.csv"))
    steps, values = plots.val_curves(old)
    assert steps == [int(r["step"]) for r in layout.read_epoch_metrics(run)] and values == pytest.approx(tb)

    assert run_main(tiny_args(tiny_mnist, logs, "--trainer.max_epochs", "3", "--ckpt_path", str(run))) == 0
    resumed = read_csv(run / "metrics.csv")
    assert [r["epoch"] for r in resumed] == ["0", "1", "2"] and resumed[:2] == rows  # earlier epochs kept
    assert [r["step"] for r in layout.read_epoch_metrics(run)] == [9, 19, 29]


def test_summarize_reads_validation_curves_from_metrics_csv_not_event_files(tmp_path):
    run = tmp_path / "exp" / "version_0"
    run.mkdir(parents=True)
    (run / "metrics.csv").write_text("epoch,step,val/acc,train/acc\n0,10,0.5,0.4\n1,20,,0.6\n2,30,0.75,0.7\n")
    assert plots.val_curves(run) == ([10, 30], [0.5, 0.75])  # no event file here at all
    assert plots.val_curves(run, "train/acc") == ([10, 20, 30], [0.4, 0.6, 0.7])
    (run / "metrics.csv").write_text("epoch,step,val/acc\n0,x,0.5\nnot,a,row\n" + "1,20,0.6,extra\n")
    assert plots.val_curves(run) == ([20], [0.6])  # hostile cells are skipped, not trusted
