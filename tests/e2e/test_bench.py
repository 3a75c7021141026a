"""A small run of ``python -m benchmarks.bench``: it runs the experiment it is given. No timing thresholds."""

from __future__ import annotations

import gc
import json

import pytest
from helpers import REPO

from benchmarks.bench import ALL_ROWS, main

# the fewest steps the benchmark takes: one untimed, one timed per segment (a batch-1 inference row times 10)
STEPS, WARMUP = 1, 1


def run_bench(tmp_path, rows, config=REPO / "configs/mnist.yaml", repeats=2):
    out = tmp_path / "bench.json"
    args = [
        "--config",
        str(config),
        "--data_dir",
        str(tmp_path / "none"),
        "--device",
        "cpu",
        "--steps",
        str(STEPS),
        "--warmup",
        str(WARMUP),
        "--repeats",
        str(repeats),
        "--num_workers",
        "0",
        # a small ceiling GEMM: 1024 x 1024 in emulated bf16 took 8 s a product on one CPU thread (3 tests x 3)
        "--gemm_size",
        "256",
        "--slim_config",
        str(REPO / "configs/slim.yaml"),  # its default, from any working directory
        "--out",
        str(out),
        "--rows",
        *rows,
    ]
    # the benchmark collects garbage before every segment: freeze the test session's objects out of those scans, as
    # a benchmark process of its own has them frozen at start (project.cli.entry.exit_with)
    gc.freeze()
    try:
        assert main(args) == 0
    finally:
        gc.unfreeze()
    return json.loads(out.read_text()), out.with_suffix(".md").read_text()


def test_bench_writes_every_row_with_the_configs_settings(tmp_path):
    names = [r for r in ALL_ROWS if r != "compile"]
    data, md = run_bench(tmp_path, names)
    rows = data["rows"]
    assert [r["row"] for r in rows] == names
    for r in rows:
        assert r["samples_per_s"] > 0 and r["peak_mem_mib"] > 10 and len(r["repeats_s"]) == 2
        s = r["settings"]
        batch = int(r["row"].rsplit("_", 1)[1]) if r["row"].startswith("infer_") else 128  # configs/mnist.yaml's
        assert (s["synthetic"], s["batch_size"], s["device"], s["net"]) == (True, batch, "cpu", "lenet")
        assert s["optimizer"] == "AdamW"  # configs/mnist.yaml's, not a hard-coded one
    by = {r["row"]: r for r in rows}
    # dense vs unstructured 50 % vs structured (configs/slim.yaml's final widths), training and inference
    slim = {"channels": [13, 34], "hidden": [340]}
    assert by["slim"]["settings"]["widths"] == by["infer_slim_256"]["settings"]["widths"] == slim
    assert data["nets"]["slim"] == {
        "params": 200_132,
        "nonzero_params": 200_132,
        "macs_per_sample": 1_082_760,
        "widths": slim,
    }
    assert data["nets"]["pruned_50"]["nonzero_params"] == 431_080 - 215_250
    assert by["infer_slim_256"]["reference"] == "infer_dense_256"
    assert by["infer_dense_1"]["settings"]["steps"] == 10 * STEPS
    assert by["infer_slim_256"]["flops_per_sample"] == 2 * 1_082_760
    assert by["infer_pruned_50_256"]["flops_per_sample"] == by["infer_dense_256"]["flops_per_sample"] == 2 * 2_293_000
    assert by["slim"]["flops_per_sample"] < 0.5 * data["flops_per_sample"]
    table = md.split("Dense vs pruned")[1]
    assert "| structured 13/34/340 | 200,132 (200,132) | 1,082,760 |" in table
    assert "| unstructured 50 % | 431,080 (215,830) | 2,293,000 |" in table
    assert by["data_in_memory"]["reference"] == "data_torchvision" and by["lightning"]["reference"] == "raw_loop"
    assert by["mixed_precision"]["settings"]["precision"] == "bf16-mixed"
    assert by["pruned_50"]["settings"]["pruned"] == 0.5
    assert "synthetic" in data["header"] and md.count("\n| ") == len(names) + 1 + 4
    # LeNet: 2.29 M multiply-adds forward (conv 0.29 M + 1.6 M, linear 0.4 M + 5 k); training is about 3x
    # that in FLOPs, less conv1's input gradient (not needed)
    assert 12e6 < data["flops_per_sample"] < 14e6
    assert data["gemm_gflops"]["fp32"] > 1 and data["gemm_gflops"]["bfloat16"] > 0
    rounds = data["fp32_gemm_gflops_per_round"]  # the fp32 ceiling: the best GEMM of the rounds, one per repeat
    assert len(rounds) == 2 and data["gemm_gflops"]["fp32"] == max(rounds) and data["gemm_size"] == 256
    for r in rows:
        if r["row"].startswith("data_"):
            assert r["gflops"] is None
        else:
            assert r["gflops"] == pytest.approx(r["samples_per_s"] * r["flops_per_sample"] / 1e9)
            if not r["row"].startswith(("infer_", "slim")):
                assert r["flops_per_sample"] == data["flops_per_sample"]
            assert r["ceiling_fraction"] > 0
            if r["ceiling_dtype"] == "fp32":  # a CPU without native bf16 emulates bf16 GEMMs: no bound there
                assert r["ceiling_fraction"] < 1.5


def test_bench_follows_another_config(tmp_path):
    cfg = tmp_path / "exp.yaml"
    cfg.write_text(
        "model:\n  net: simple_cnn\n  optimizer: {class_path: torch.optim.SGD, init_args: {lr: 0.05}}\n"
        "data:\n  class_path: project.data.CIFAR10DataModule\n  init_args: {batch_size: 16}\n"
    )
    data, _ = run_bench(tmp_path, ["raw_loop", "lightning_in_memory"], config=cfg)
    for r in data["rows"]:
        s = r["settings"]
        assert (s["net"], s["dataset"], s["batch_size"], s["optimizer"]) == ("simple_cnn", "CIFAR10", 16, "SGD")


def test_bench_bad_config_is_one_error(tmp_path, capsys):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("model:\n  nett: lenet\n")
    assert main(["--config", str(cfg), "--rows", "raw_loop", "--out", str(tmp_path / "b.json")]) == 2
    err = [x for x in capsys.readouterr().err.splitlines() if x.startswith("error:")]
    assert len(err) == 1 and "nett" in err[0]


@pytest.mark.slow
def test_bench_compile_row(tmp_path):
    data, _ = run_bench(tmp_path, ["raw_loop", "compile"], repeats=1)  # one compile
    assert data["rows"][1]["settings"]["compile"] is True and data["rows"][1]["samples_per_s"] > 0
