"""Tiny data sets in the exact on-disk formats torchvision reads (IDX archives, learnable images), and a tiny
finished run trained on them: shared by tests/conftest.py's fixtures and the tests that need their own copy."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import pickle
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torchvision

from project.data import archives


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


def make_tiny_kmnist(root: Path, monkeypatch: pytest.MonkeyPatch) -> dict:
    """Write KMNIST's four ``.gz`` archives in the MNIST format (600 train / 100 test learnable images; KMNIST's
    own layout, which torchvision reads as MNIST's) into ``root/source`` and patch torchvision's archive md5 list
    and the IDX sizes through ``monkeypatch``. No content md5 is patched: KMNIST publishes none, and the data
    module checks its files against the kept archives. Returns ``{"source": archives, "data": empty data_dir}``."""
    rng = np.random.default_rng(3)
    source = root / "source"
    source.mkdir(parents=True)
    sizes, resources = {}, []
    for split, n in (("train", 600), ("t10k", 100)):
        labels = rng.integers(0, 10, size=n).astype(np.uint8)
        for kind, arr in (("images-idx3", learnable_images(labels, (28, 28), rng)), ("labels-idx1", labels)):
            name = f"{split}-{kind}-ubyte"
            raw = idx_bytes(arr)
            gz = gzip.compress(raw, mtime=0)
            (source / f"{name}.gz").write_bytes(gz)
            sizes[name] = len(raw)
            resources.append((f"{name}.gz", md5(gz)))
    monkeypatch.setattr(torchvision.datasets.KMNIST, "resources", resources)
    monkeypatch.setitem(archives.RAW_SIZES, "KMNIST", sizes)
    return {"source": source, "data": root / "data"}


# A ``sitecustomize.py`` for the Python processes a test starts (:func:`tables_site`): it sets the tiny data set's md5
# and size tables as soon as the project imports project.data.archives (nothing is imported earlier: torchrun's agent
# sets its log level before torch loads), so a child's command is unchanged (``python -m project.fit ...``) and the
# processes it starts in turn (DDP ranks, torchrun's workers) get the same tables.
SITECUSTOMIZE = '''"""Test-only (tests/tiny_data.py): the tiny data set's md5 and size tables."""
import importlib.machinery
import json
import sys

TABLES = json.loads({tables!r})


class TinyTables:
    def find_spec(self, name, path=None, target=None):
        if name != "project.data.archives":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            for key in ("MNIST", "FashionMNIST"):
                module.RAW_MD5[key] = TABLES["raw_md5"]
                module.RAW_SIZES[key] = TABLES["raw_sizes"]
                if TABLES["resources"]:
                    getattr(module.datasets, key).resources = [tuple(r) for r in TABLES["resources"]]

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, TinyTables())
'''


def tables_site(folder: Path, raw: Path | None = None) -> Path:
    """Write ``folder/sitecustomize.py``, which gives every Python process started with ``folder`` on its
    ``PYTHONPATH`` (:func:`with_site`) the tiny data set's tables for MNIST and Fashion-MNIST alike: the md5 sums and
    sizes of the extracted files in ``raw`` (a data set's ``raw`` folder), or without ``raw`` the tables
    :func:`make_tiny_mnist` patched in this process, archives' md5 sums included. Returns ``folder``."""
    if raw is None:
        tables = {
            "raw_md5": archives.RAW_MD5["MNIST"],
            "raw_sizes": archives.RAW_SIZES["MNIST"],
            "resources": torchvision.datasets.MNIST.resources,
        }
    else:
        files = sorted(p for p in raw.iterdir() if p.is_file())
        tables = {
            "raw_md5": {p.name: md5(p.read_bytes()) for p in files},
            "raw_sizes": {p.name: p.stat().st_size for p in files},
            "resources": [],
        }
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(SITECUSTOMIZE.format(tables=json.dumps(tables)))
    return folder


def with_site(env: dict[str, str], site: Path) -> dict[str, str]:
    """``env`` with :func:`tables_site`'s ``site`` first on ``PYTHONPATH`` and one OpenMP thread (on a busy 2-core
    machine two threads per process make each training step several times slower)."""
    path = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH", "")]))
    return {**env, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}


# Unstructured pruning on a schedule (60 % of the weights, epochs 1 to 3), as the pruning tests train it
PRUNING = [
    *("--trainer.deterministic", "true", "--trainer.callbacks+=project.callbacks.Pruning"),
    *(
        "--trainer.callbacks.amount",
        "0.6",
        "--trainer.callbacks.start_epoch",
        "1",
        "--trainer.callbacks.end_epoch",
        "3",
    ),
]


def train_tiny_run(root: Path, *args: str) -> tuple[Path, dict]:
    """Train LeNet on :func:`make_tiny_mnist` data under ``root`` with ``args`` (default: 2 epochs), the md5 and size
    tables patched only while it trains; returns its run folder and the data paths."""
    from helpers import run_dirs, run_main, tiny_args

    with pytest.MonkeyPatch.context() as mp:
        paths = make_tiny_mnist(root / "mnist", mp)
        mp.chdir(root)
        graph = ("--trainer.logger.init_args.log_graph", "true")  # a whole run, as fit writes it (shared: built once)
        assert run_main(tiny_args(paths, root / "logs", *graph, *(args or ("--trainer.max_epochs", "2")))) == 0
    (run,) = run_dirs(root / "logs")
    return run, paths


def make_image_folder(
    root: Path, classes: tuple[str, ...] = ("cat", "dog", "frog"), per_class: int = 40, splits=("train", "test")
) -> Path:
    """Write PNG folders in torchvision's ImageFolder layout, ``root/<split>/<class>/<i>.png`` (RGB, 40x30 pixels:
    not the nets' size), learnable: noise plus a bright class-specific band. Returns ``root``."""
    from PIL import Image

    rng = np.random.default_rng(7)
    for s, split in enumerate(splits):
        n = per_class if split == "train" else max(per_class // 4, 2)
        for c, name in enumerate(classes):
            folder = root / split / name
            folder.mkdir(parents=True, exist_ok=True)
            labels = np.full(n, c)
            for i, image in enumerate(learnable_images(labels, (30, 40, 3), rng)):
                Image.fromarray(image).save(folder / f"{s}{i:03d}.png")
    return root


def make_tiny_cifar(root: Path, monkeypatch: pytest.MonkeyPatch, cls: type) -> dict:
    """Write ``cls``'s python archive (torchvision's CIFAR10 or CIFAR100) into ``root/source`` in the exact format
    torchvision reads: CIFAR-10 five training batches of 100 images and a test batch of 100 (``labels``), CIFAR-100
    one ``train`` file of 300 and a ``test`` file of 100 (``fine_labels``, 0-99); learnable images. The class's md5
    lists are patched through ``monkeypatch``. Returns ``{"source": archives folder, "data": empty data_dir}``."""
    rng = np.random.default_rng(1)
    hundred = cls is torchvision.datasets.CIFAR100
    classes = 100 if hundred else 10
    folder = root / "build" / cls.base_folder
    folder.mkdir(parents=True)
    names = (
        [("train", 300), ("test", 100)]
        if hundred
        else [*((f"data_batch_{i}", 100) for i in range(1, 6)), ("test_batch", 100)]
    )
    files = {}
    for name, n in names:
        labels = rng.integers(0, classes, size=n)
        images = learnable_images(labels % 10, (32, 32, 3), rng)  # HWC, as in the real pickles
        data = images.transpose(0, 3, 1, 2).reshape(n, 3072)  # the pickles store rows of R, G, B planes
        key = "fine_labels" if hundred else "labels"
        payload = pickle.dumps({"batch_label": name, key: labels.tolist(), "data": data})
        (folder / name).write_bytes(payload)
        files[name] = md5(payload)
    meta_key = cls.meta["key"]
    meta = pickle.dumps({meta_key: [f"class{i}" for i in range(classes)]})
    (folder / cls.meta["filename"]).write_bytes(meta)
    source = root / "source"
    source.mkdir()
    archive = source / cls.filename
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(folder, arcname=cls.base_folder)
    train = [name for name, _ in names[:-1]]
    monkeypatch.setattr(cls, "train_list", [[name, files[name]] for name in train])
    monkeypatch.setattr(cls, "test_list", [[names[-1][0], files[names[-1][0]]]])
    monkeypatch.setattr(cls, "meta", {"filename": cls.meta["filename"], "key": meta_key, "md5": md5(meta)})
    monkeypatch.setattr(cls, "tgz_md5", md5(archive.read_bytes()))
    return {"source": source, "data": root / "data"}
