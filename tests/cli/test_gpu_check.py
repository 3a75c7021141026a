"""project.cli.checks.check_gpu_present: the GPU overlays where torch finds no usable GPU say what to do."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from helpers import REPO

from project.cli import checks
from project.errors import ConfigError


def cfg(accelerator):
    return SimpleNamespace(trainer=SimpleNamespace(accelerator=accelerator))


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine where torch finds no GPU")
def test_gpu_overlay_without_a_gpu_is_one_line_with_the_fix(tmp_path):
    """configs/trainer/gpu.yaml on a machine without a GPU (Lightning's own words: ``No supported gpu backend
    found!``): one ``error:`` line naming the CPU switch, the container flags and the driver; nothing written."""
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "project.fit", "--config", str(REPO / "configs/fashion_mnist.yaml")),
            *("--config", str(REPO / "configs/trainer/gpu.yaml"), "--data.data_dir", str(tmp_path / "data")),
            *("--trainer.logger.init_args.save_dir", str(tmp_path / "logs")),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("error: trainer.accelerator: gpu, but torch ") and "finds no usable NVIDIA GPU" in line
    for fix in ("--trainer.accelerator cpu", "docker run --gpus all", "--device nvidia.com/gpu=all", ">= 580"):
        assert fix in line, fix
    assert not list(tmp_path.iterdir())


def fake_gpus(monkeypatch, *capabilities, arches=("sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120")):
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_arch_list", lambda: list(arches))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(capabilities))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i: capabilities[i])
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i: f"GPU-{i}")


def test_a_gpu_the_build_has_no_kernels_for_is_refused(monkeypatch):
    """A V100 (sm_70) beside an H100 (sm_90) under the locked build (sm_75 ... sm_120): refused, naming the GPU and
    the build's list; same-major newer GPUs (sm_89: L4, L40, RTX 40xx run sm_86 kernels) and PTX pass."""
    fake_gpus(monkeypatch, (9, 0), (7, 0))
    with pytest.raises(ConfigError, match=r"GPU 1 \(GPU-1, sm_70\) is not supported by torch .* sm_75 sm_80"):
        checks.check_gpu_present(cfg("gpu"))
    fake_gpus(monkeypatch, (8, 9), (12, 1), (10, 3))
    checks.check_gpu_present(cfg("cuda"))
    fake_gpus(monkeypatch, (7, 0), arches=("sm_80", "compute_70"))  # PTX for 7.0: compiled on the GPU
    checks.check_gpu_present(cfg("gpu"))
    fake_gpus(monkeypatch, (6, 1))
    checks.check_gpu_present(cfg("cpu"))  # not asked for a GPU: nothing to check
    checks.check_gpu_present(cfg("auto"))


def test_a_cpu_build_of_torch_is_named(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", None)
    with pytest.raises(ConfigError, match="built for the CPU only"):
        checks.check_gpu_present(cfg("gpu"))
