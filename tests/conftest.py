"""Shared fixtures: tiny data sets written in the exact on-disk formats torchvision reads, the real
Fashion-MNIST archives when installed, and small Trainer settings for CPU runs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torchvision
from tiny_data import PRUNING, make_tiny_cifar, make_tiny_mnist, train_tiny_run

from project import data as data_mod

FASHION_SOURCE = Path(os.environ.get("FASHION_MNIST_DIR", "/usr/share/datasets/fashion-mnist"))
IDX_NAMES = ["train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"]


E2E = Path(__file__).parent / "e2e"


def pytest_collection_modifyitems(items):
    """Every test under ``tests/e2e/`` (real data, whole processes, DDP, kill tests, the image) is ``slow``: the
    inner loop ``pytest -m "not slow"`` leaves them to the full suite, which CI runs. Slow tests run first (a stable
    sort), so that with pytest-xdist the last minutes are short tests that balance across the workers instead of
    one long test that keeps the others waiting."""
    for item in items:
        if E2E in Path(item.path).parents:
            item.add_marker(pytest.mark.slow)
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def pytest_configure(config):
    """Under pytest-xdist, each worker gets its share of the cores for torch's intra-op threads (and the processes its
    tests start, through ``OMP_NUM_THREADS``): two workers on 2 cores each running 2 threads over tiny tensors spend
    their time contending (measured: the whole suite 794 s with the default threads, 684 s with one a worker)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers:
        threads = max(1, (os.cpu_count() or 1) // workers)
        os.environ["OMP_NUM_THREADS"] = str(threads)
        torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def restore_torch_globals():
    """Put back the process-wide torch switches a Trainer sets (``benchmark``, ``deterministic``, cudnn
    ``enabled``, default dtype, matmul precision) after each test, so an in-process run cannot change how a later
    test's loaders batch (``benchmark: true`` drops the last partial batch) or what it computes."""
    cudnn = torch.backends.cudnn
    saved = (
        cudnn.benchmark,
        cudnn.deterministic,
        cudnn.enabled,
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.get_default_dtype(),
        torch.get_float32_matmul_precision(),
    )
    yield
    cudnn.benchmark, cudnn.deterministic, cudnn.enabled = saved[:3]
    torch.use_deterministic_algorithms(saved[3], warn_only=saved[4])
    torch.set_default_dtype(saved[5])
    torch.set_float32_matmul_precision(saved[6])


@pytest.fixture
def tiny_mnist(tmp_path, monkeypatch):
    """Write MNIST-format archives (600 train / 100 test images) into ``source/``; patch the md5 and size tables.

    Returns a dict with ``source`` (archives) and ``data`` (empty data_dir) paths, for MNIST and
    Fashion-MNIST alike (both data modules read the same format).
    """
    return make_tiny_mnist(tmp_path / "mnist", monkeypatch)


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory) -> Path:
    """A finished 2-epoch LeNet run on :func:`make_tiny_mnist` data, shared by the session (read it, don't change
    it). Returns its run folder."""
    return train_tiny_run(tmp_path_factory.mktemp("trained_run"))[0]


@pytest.fixture(scope="session")
def pruned_run(tmp_path_factory) -> Path:
    """A finished 4-epoch LeNet run with unstructured pruning (:data:`tiny_data.PRUNING`: 60 % by epoch 3) on
    :func:`make_tiny_mnist` data, shared by the session (read it, don't change it; copy it to run a command on it)."""
    return train_tiny_run(tmp_path_factory.mktemp("pruned_run"), "--trainer.max_epochs", "4", *PRUNING)[0]


@pytest.fixture(scope="session")
def slimmed_run(tmp_path_factory) -> Path:
    """A finished 3-epoch LeNet run with ``configs/slim.yaml`` (channels removed at epoch 1) on
    :func:`make_tiny_mnist` data, shared by the session (read it, don't change it; copy it to run a command on it)."""
    slim = str(Path(__file__).parents[1] / "configs" / "slim.yaml")
    return train_tiny_run(tmp_path_factory.mktemp("slimmed_run"), "--config", slim, "--trainer.max_epochs", "3")[0]


@pytest.fixture
def tiny_cifar(tmp_path, monkeypatch):
    """Write a CIFAR-10 python archive (5 x 100 train / 100 test images) into ``source/``; patch md5s."""
    return make_tiny_cifar(tmp_path / "cifar", monkeypatch, torchvision.datasets.CIFAR10)


@pytest.fixture
def tiny_cifar100(tmp_path, monkeypatch):
    """Write a CIFAR-100 python archive (300 train / 100 test images, fine labels 0-99) into ``source/``; patch
    md5s."""
    return make_tiny_cifar(tmp_path / "cifar100", monkeypatch, torchvision.datasets.CIFAR100)


@pytest.fixture(scope="session")
def fashion_source() -> Path:
    """The original Fashion-MNIST archives (Debian package ``dataset-fashion-mnist``).

    In CI (``CI`` set) their absence is a failure, not a skip: the real-data tests must run there.
    """
    if not all((FASHION_SOURCE / f"{n}.gz").is_file() for n in IDX_NAMES):
        msg = f"Fashion-MNIST archives not found in {FASHION_SOURCE} (apt-get install dataset-fashion-mnist)"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    return FASHION_SOURCE


@pytest.fixture(scope="session")
def fashion_data(fashion_source, tmp_path_factory) -> Path:
    """A data_dir with Fashion-MNIST imported once for the whole session (read-only for tests)."""
    root = tmp_path_factory.mktemp("fashion_data")
    data_mod.FashionMNISTDataModule(data_dir=str(root), source_dir=str(fashion_source)).prepare_data()
    return root
