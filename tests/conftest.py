"""Shared fixtures: tiny data sets written in the exact on-disk formats torchvision reads, the real
Fashion-MNIST archives when installed, and small Trainer settings for CPU runs."""

from __future__ import annotations

import gzip
import hashlib
import os
import pickle
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision

from project import data as data_mod
from project.data import archives

FASHION_SOURCE = Path(os.environ.get("FASHION_MNIST_DIR", "/usr/share/datasets/fashion-mnist"))
IDX_NAMES = ["train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"]


E2E = Path(__file__).parent / "e2e"


def pytest_collection_modifyitems(items):
    """Every test under ``tests/e2e/`` (real data, whole processes, DDP, kill tests, the image) is ``slow``: the
    inner loop ``pytest -m "not slow"`` leaves them to the full suite, which CI runs."""
    for item in items:
        if E2E in Path(item.path).parents:
            item.add_marker(pytest.mark.slow)


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


def md5(b: bytes) -> str:
    return hashlib.md5(b).hexdigest()


def idx_bytes(array: np.ndarray) -> bytes:
    """LeCun's IDX format: magic (0, 0, 0x08 = uint8, ndim), big-endian int32 dims, raw bytes."""
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    return header + array.astype(np.uint8).tobytes()


def learnable_images(labels: np.ndarray, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Noise plus a bright class-specific stripe, so a CNN can beat chance within a few steps."""
    images = rng.integers(0, 60, size=(len(labels), *shape), dtype=np.uint8)
    rows = shape[-2] if len(shape) == 2 else shape[0]
    band = max(rows // 10, 1)
    for i, label in enumerate(labels):
        if len(shape) == 2:
            images[i, label * band : (label + 1) * band, :] = 250
        else:
            images[i, label * band : (label + 1) * band, :, :] = 250
    return images


def make_tiny_mnist(root: Path, monkeypatch: pytest.MonkeyPatch) -> dict:
    """Write MNIST-format archives (600 train / 100 test images) into ``root/source``; patch the md5 and size
    tables through ``monkeypatch``. Returns ``{"source": archives folder, "data": empty data_dir}``."""
    rng = np.random.default_rng(0)
    source = root / "source"
    source.mkdir(parents=True)
    raw_md5, raw_sizes, resources = {}, {}, []
    for split, n in (("train", 600), ("t10k", 100)):
        labels = rng.integers(0, 10, size=n).astype(np.uint8)
        images = learnable_images(labels, (28, 28), rng)
        for kind, arr in (("images-idx3", images), ("labels-idx1", labels)):
            name = f"{split}-{kind}-ubyte"
            raw = idx_bytes(arr)
            gz = gzip.compress(raw, mtime=0)
            (source / f"{name}.gz").write_bytes(gz)
            raw_md5[name] = md5(raw)
            raw_sizes[name] = len(raw)
            resources.append((f"{name}.gz", md5(gz)))
    for cls, key in ((torchvision.datasets.MNIST, "MNIST"), (torchvision.datasets.FashionMNIST, "FashionMNIST")):
        monkeypatch.setattr(cls, "resources", resources)
        monkeypatch.setitem(archives.RAW_MD5, key, raw_md5)
    # the published sizes bound decompression (raising=False: also runs against code without the table)
    monkeypatch.setattr(archives, "RAW_SIZES", {"MNIST": raw_sizes, "FashionMNIST": raw_sizes}, raising=False)
    return {"source": source, "data": root / "data"}


@pytest.fixture
def tiny_mnist(tmp_path, monkeypatch):
    """Write MNIST-format archives (600 train / 100 test images) into ``source/``; patch the md5 and size tables.

    Returns a dict with ``source`` (archives) and ``data`` (empty data_dir) paths, for MNIST and
    Fashion-MNIST alike (both data modules read the same format).
    """
    return make_tiny_mnist(tmp_path / "mnist", monkeypatch)


def train_tiny_run(root: Path) -> tuple[Path, dict]:
    """Train a 2-epoch LeNet on :func:`make_tiny_mnist` data under ``root`` (the md5 and size tables patched only
    while it trains); returns its run folder and the data paths."""
    from helpers import run_dirs, run_main, tiny_args

    with pytest.MonkeyPatch.context() as mp:
        paths = make_tiny_mnist(root / "mnist", mp)
        mp.chdir(root)
        assert run_main(tiny_args(paths, root / "logs", "--trainer.max_epochs", "2")) == 0
    (run,) = run_dirs(root / "logs")
    return run, paths


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory) -> Path:
    """A finished 2-epoch LeNet run on :func:`make_tiny_mnist` data, shared by the session (read it, don't change
    it). Returns its run folder."""
    return train_tiny_run(tmp_path_factory.mktemp("trained_run"))[0]


@pytest.fixture
def tiny_cifar(tmp_path, monkeypatch):
    """Write a CIFAR-10 python archive (5 x 100 train / 100 test images) into ``source/``; patch md5s."""
    rng = np.random.default_rng(1)
    root = tmp_path / "cifar"
    folder = root / "build" / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    files = {}
    for name, n in [(f"data_batch_{i}", 100) for i in range(1, 6)] + [("test_batch", 100)]:
        labels = rng.integers(0, 10, size=n)
        images = learnable_images(labels, (32, 32, 3), rng)  # HWC, as in the real pickles
        data = images.transpose(0, 3, 1, 2).reshape(n, 3072)  # the pickles store rows of R, G, B planes
        payload = pickle.dumps({"batch_label": name, "labels": labels.tolist(), "data": data})
        (folder / name).write_bytes(payload)
        files[name] = md5(payload)
    meta = pickle.dumps(
        {"label_names": ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]}
    )
    (folder / "batches.meta").write_bytes(meta)
    source = root / "source"
    source.mkdir()
    archive = source / "cifar-10-python.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(folder, arcname="cifar-10-batches-py")
    cls = torchvision.datasets.CIFAR10
    monkeypatch.setattr(cls, "train_list", [[f"data_batch_{i}", files[f"data_batch_{i}"]] for i in range(1, 6)])
    monkeypatch.setattr(cls, "test_list", [["test_batch", files["test_batch"]]])
    monkeypatch.setattr(cls, "meta", {"filename": "batches.meta", "key": "label_names", "md5": md5(meta)})
    monkeypatch.setattr(cls, "tgz_md5", md5(archive.read_bytes()))
    return {"source": source, "data": root / "data"}


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
