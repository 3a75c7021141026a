"""A small run of ``python -m project.bench``: every row present, sane positive numbers. No timing thresholds."""

from __future__ import annotations

import json

import pytest
from helpers import REPO

from project.bench import ALL_ROWS, main


def run_bench(tmp_path, rows):
    out = tmp_path / "bench.json"
    args = ["--config", str(REPO / "configs/mnist.yaml"), "--data_dir", str(tmp_path / "none"), "--device", "cpu",
            "--steps", "3", "--warmup", "2", "--repeats", "2", "--num_workers", "0", "--out", str(out),
            "--rows", *rows]  # fmt: skip
    assert main(args) == 0
    return json.loads(out.read_text()), out.with_suffix(".md").read_text()


def check(rows, names):
    assert [r["row"] for r in rows] == names
    for r in rows:
        assert r["samples_per_s"] > 0 and r["ms_per_step"] > 0 and r["peak_mem_mib"] > 10
        assert len(r["repeats_s"]) == 2 and all(t > 0 for t in r["repeats_s"])
        assert r["settings"]["synthetic"] is True and r["settings"]["batch_size"] == 64
        assert r["settings"]["device"] == "cpu" and r["settings"]["net"] == "lenet"
        assert r["samples_per_s"] == pytest.approx(3 * 64 / (r["ms_per_step"] * 3 / 1000))


def test_bench_writes_every_row(tmp_path):
    names = [r for r in ALL_ROWS if r != "compile"]
    data, md = run_bench(tmp_path, names)
    rows = data["rows"]
    check(rows, names)
    by = {r["row"]: r for r in rows}
    assert by["raw_loop"]["ratio"] == 1.0 and by["data_torchvision"]["ratio"] == 1.0
    assert by["lightning"]["ratio"] == pytest.approx(by["lightning"]["samples_per_s"] / by["raw_loop"]["samples_per_s"])
    assert by["data_in_memory"]["reference"] == "data_torchvision"
    assert by["mixed_precision"]["settings"]["precision"] == "bf16-mixed"
    assert by["pruned_50"]["settings"]["pruned"] == 0.5
    assert "synthetic" in data["header"] and md.count("\n| ") == len(names) + 1


@pytest.mark.slow
def test_bench_compile_row(tmp_path):
    data, _ = run_bench(tmp_path, ["raw_loop", "compile"])
    check(data["rows"], ["raw_loop", "compile"])
    assert data["rows"][1]["settings"]["compile"] is True
