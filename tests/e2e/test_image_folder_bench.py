"""``python -m benchmarks.image_folder`` (docs/benchmarks.md), shortened: real Fashion-MNIST images written as PNG
files, the folder decoded then read from its cache, and a fit on each path with the table and JSON it reports."""

from __future__ import annotations

import json

from benchmarks.image_folder import main


def test_image_folder_benchmark_runs_both_paths_and_reports_them(fashion_source, tmp_path, capsys):
    short = "--trainer.max_epochs 2 --trainer.limit_train_batches 2 --trainer.limit_val_batches 1"
    short += " --trainer.limit_test_batches 2 --data.num_workers 0 --data.persistent_workers false"
    args = ["--source_dir", str(fashion_source), "--work", str(tmp_path), "--seeds", "1", "--limit", "300"]
    assert main([*args, "--val_size", "100", "--fit_args", short]) == 0
    assert len(list((tmp_path / "png" / "train").rglob("*.png"))) == 300
    assert len(list((tmp_path / "png" / "test").rglob("*.png"))) == 300
    out = json.loads((tmp_path / "image_folder.json").read_text())
    assert out["first_run_decode_s"] > 0 and out["cached_run_s"] > 0
    for path in ("IDX archives", "PNG folder"):
        row = out["fits"][path]
        assert row["epoch_time_s"] > 0 and len(row["test_acc"]) == 1 and 0 <= row["test_acc_mean"] <= 1
    table = capsys.readouterr().out
    assert "| IDX archives |" in table and "| PNG folder |" in table
