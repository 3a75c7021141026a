import gzip
import math
import shutil

import pytest
import torch
from torchvision.datasets.mnist import read_image_file, read_label_file

from project.data.memory import EpochBatches
from project.data.modules import CIFAR10DataModule, FashionMNISTDataModule, MNISTDataModule
from project.errors import ConfigError, DataError


def make(cls, paths, **kw):
    return cls(data_dir=str(paths["data"]), source_dir=str(paths["source"]), **kw)


@pytest.mark.parametrize("cls", [MNISTDataModule, FashionMNISTDataModule])
def test_mnist_family_imports_archives_and_splits(cls, tiny_mnist):
    dm = make(cls, tiny_mnist, val_size=100, batch_size=32)
    dm.prepare_data()
    raw = tiny_mnist["data"] / cls.dataset_cls.__name__ / "raw"
    assert sorted(p.name for p in raw.iterdir()) == sorted(
        ["train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"]
    )
    dm.setup("fit")
    train_idx, val_idx = dm.split
    assert (len(train_idx), len(val_idx), len(dm.test_set)) == (500, 100, 100)
    assert not set(train_idx.tolist()) & set(val_idx.tolist())
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (32, 1, 28, 28) and x.dtype == torch.float32
    assert y.shape == (32,) and y.dtype == torch.int64
    assert len(dm.test_dataloader().dataset) == 100


def test_split_is_seeded_and_setup_idempotent(tiny_mnist):
    a = make(MNISTDataModule, tiny_mnist, val_size=100)
    a.prepare_data()
    a.setup("fit")
    first = [t.clone() for t in a.split]
    a.setup("test")
    assert all(torch.equal(x, y) for x, y in zip(first, a.split))
    b = make(MNISTDataModule, tiny_mnist, val_size=100)
    b.setup("fit")
    assert all(torch.equal(x, y) for x, y in zip(first, b.split))
    c = make(MNISTDataModule, tiny_mnist, val_size=100, seed=1)
    c.setup("fit")
    assert not torch.equal(first[1], c.split[1])


def test_normalization_uses_standard_stats(tiny_mnist):
    dm = make(MNISTDataModule, tiny_mnist, val_size=100)
    dm.prepare_data()
    dm.setup("fit")
    x, _ = dm.test_set[0]
    raw = dm.test_set.data[0].float() / 255
    assert torch.allclose(x[0], (raw - 0.1307) / 0.3081, atol=1e-6)


def test_missing_archive_in_source_dir_is_named(tiny_mnist):
    (tiny_mnist["source"] / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(DataError, match="t10k-labels-idx1-ubyte.gz"):
        make(MNISTDataModule, tiny_mnist).prepare_data()


def test_bit_flipped_archive_is_rejected_by_md5(tiny_mnist):
    path = tiny_mnist["source"] / "train-images-idx3-ubyte.gz"
    raw = bytearray(gzip.decompress(path.read_bytes()))
    raw[-1] ^= 0xFF  # same size, one pixel changed, re-compressed into a valid gzip
    path.write_bytes(gzip.compress(bytes(raw), mtime=0))
    with pytest.raises(DataError, match="train-images-idx3-ubyte.gz fails its md5"):
        make(MNISTDataModule, tiny_mnist).prepare_data()
    assert not (tiny_mnist["data"] / "MNIST" / "raw" / "train-images-idx3-ubyte").exists()


def test_recompressed_archive_with_original_content_is_accepted(tiny_mnist):
    path = tiny_mnist["source"] / "train-labels-idx1-ubyte.gz"
    path.write_bytes(gzip.compress(gzip.decompress(path.read_bytes()), compresslevel=1, mtime=12345))
    make(MNISTDataModule, tiny_mnist).prepare_data()


@pytest.mark.parametrize("cls", [MNISTDataModule, FashionMNISTDataModule])
def test_truncated_extracted_file_is_caught(cls, tiny_mnist):
    dm = make(cls, tiny_mnist)
    dm.prepare_data()
    path = tiny_mnist["data"] / cls.dataset_cls.__name__ / "raw" / "train-images-idx3-ubyte"
    path.write_bytes(path.read_bytes()[:-100])
    for check in (dm.prepare_data, lambda: make(cls, tiny_mnist).setup("fit")):
        with pytest.raises(DataError, match=r"train-images-idx3-ubyte is truncated.*source_dir"):
            check()


@pytest.mark.parametrize("cls", [MNISTDataModule, FashionMNISTDataModule])
def test_a_processed_pt_planted_beside_the_raw_files_is_ignored(cls, tiny_mnist):
    """torchvision prefers ``<Dataset>/processed/{training,test}.pt`` to the md5-checked raw files; a pair planted
    there (all black, every label 7) must not be what trains or tests: the data are the raw files' own."""
    dm = make(cls, tiny_mnist, val_size=100)
    dm.prepare_data()
    folder = tiny_mnist["data"] / cls.dataset_cls.__name__
    (folder / "processed").mkdir()
    for name, n in (("training.pt", 600), ("test.pt", 100)):
        torch.save((torch.zeros(n, 28, 28, dtype=torch.uint8), torch.full((n,), 7)), folder / "processed" / name)
    dm.setup("fit")
    for dataset, split in ((dm.train_set, "train"), (dm.test_set, "t10k")):
        assert torch.equal(dataset.data, read_image_file(str(folder / "raw" / f"{split}-images-idx3-ubyte")))
        assert torch.equal(dataset.targets, read_label_file(str(folder / "raw" / f"{split}-labels-idx1-ubyte")))
        assert dataset.targets.unique().numel() == 10


def test_same_size_corruption_of_extracted_file_fails_md5(tiny_mnist):
    dm = make(MNISTDataModule, tiny_mnist)
    dm.prepare_data()
    path = tiny_mnist["data"] / "MNIST" / "raw" / "t10k-labels-idx1-ubyte"
    raw = bytearray(path.read_bytes())
    raw[-1] = (raw[-1] + 1) % 10
    path.write_bytes(bytes(raw))
    with pytest.raises(DataError, match="t10k-labels-idx1-ubyte fails its md5"):
        dm.prepare_data()


def test_no_data_and_no_download_says_how_to_fix(tmp_path):
    with pytest.raises(DataError, match=r"data.download: true, or data.source_dir"):
        MNISTDataModule(data_dir=str(tmp_path), download=False).prepare_data()


def test_offline_download_fails_with_one_clear_message(tmp_path, monkeypatch):
    import torchvision

    # A closed local port stands in for "no network" without depending on this machine's firewall.
    monkeypatch.setattr(torchvision.datasets.MNIST, "mirrors", ["http://127.0.0.1:9/a/", "http://127.0.0.1:9/b/"])
    with pytest.raises(DataError) as info:
        MNISTDataModule(data_dir=str(tmp_path), download=True).prepare_data()
    msg = str(info.value)
    assert "downloading MNIST failed" in msg and "train-images-idx3-ubyte.gz" in msg and "data.source_dir" in msg
    assert "\n" not in msg


def test_failed_download_leaves_no_folders_behind(tmp_path, monkeypatch):
    import torchvision

    monkeypatch.setattr(torchvision.datasets.MNIST, "mirrors", ["http://127.0.0.1:9/a/"])
    fresh = tmp_path / "fresh" / "data"
    with pytest.raises(DataError):
        MNISTDataModule(data_dir=str(fresh), download=True).prepare_data()
    assert not (tmp_path / "fresh").exists()
    existing = tmp_path / "existing"
    existing.mkdir()
    with pytest.raises(DataError):
        MNISTDataModule(data_dir=str(existing), download=True).prepare_data()
    assert list(existing.iterdir()) == []


@pytest.mark.parametrize("cls", [MNISTDataModule, FashionMNISTDataModule])
def test_archives_where_torchvision_downloads_them_are_used_not_fetched(cls, tiny_mnist, monkeypatch):
    import torchvision

    def no_network(*args, **kwargs):
        raise AssertionError("tried to download data that is on disk")

    monkeypatch.setattr(torchvision.datasets.utils, "urlopen", no_network, raising=False)
    monkeypatch.setattr(cls.dataset_cls, "download", no_network)
    dm = cls(data_dir=str(tiny_mnist["data"]), download=True, val_size=100)
    dm.raw_folder.mkdir(parents=True)
    for archive in tiny_mnist["source"].iterdir():
        shutil.copy(archive, dm.raw_folder / archive.name)  # torchvision's downloaded-not-extracted layout
    dm.prepare_data()
    dm.setup("fit")
    assert len(dm.split[0]) == 500 and all(p.is_file() for p in dm.expected_files())


def test_cifar_archive_in_data_dir_is_used_not_fetched(tiny_cifar, monkeypatch):
    def no_network(*args, **kwargs):
        raise AssertionError("tried to download data that is on disk")

    monkeypatch.setattr(CIFAR10DataModule.dataset_cls, "download", no_network)
    data = tiny_cifar["data"]
    data.mkdir(parents=True)
    shutil.copy(tiny_cifar["source"] / "cifar-10-python.tar.gz", data)
    dm = CIFAR10DataModule(data_dir=str(data), download=True, val_size=100)
    dm.prepare_data()
    dm.setup("fit")
    assert len(dm.split[0]) == 400


def test_bad_values_are_config_errors(tiny_mnist):
    dm = make(MNISTDataModule, tiny_mnist, val_size=600)
    dm.prepare_data()
    with pytest.raises(ConfigError, match=r"data.val_size: 600 must be smaller than the 600 training images"):
        dm.setup("fit")


def test_cifar10_imports_loads_and_augments(tiny_cifar):
    dm = make(CIFAR10DataModule, tiny_cifar, val_size=50, batch_size=16, augment=True)
    dm.prepare_data()
    dm.setup("fit")
    assert (len(dm.split[0]), len(dm.split[1]), len(dm.test_set)) == (450, 50, 100)
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (16, 3, 32, 32) and y.shape == (16,)
    # validation is never augmented: identical on every read
    v1, v2 = dm.val_set[int(dm.split[1][0])][0], dm.val_set[int(dm.split[1][0])][0]
    assert torch.equal(v1, v2)
    img = torch.as_tensor(dm.test_set.data[0]).permute(2, 0, 1).float() / 255
    mean, std = torch.tensor(dm.mean)[:, None, None], torch.tensor(dm.std)[:, None, None]
    assert torch.allclose(dm.test_set[0][0], (img - mean) / std, atol=1e-6)


def test_cifar10_truncated_batch_is_named(tiny_cifar):
    dm = make(CIFAR10DataModule, tiny_cifar)
    dm.prepare_data()
    path = tiny_cifar["data"] / "cifar-10-batches-py" / "data_batch_3"
    path.write_bytes(path.read_bytes()[:1000])
    with pytest.raises(DataError, match=r"data_batch_3 fails its md5.*source_dir"):
        make(CIFAR10DataModule, tiny_cifar).setup("fit")


def test_cifar10_bit_flipped_archive_is_rejected(tiny_cifar):
    path = tiny_cifar["source"] / "cifar-10-python.tar.gz"
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    path.write_bytes(bytes(raw))
    with pytest.raises(DataError, match="cifar-10-python.tar.gz fails its md5"):
        make(CIFAR10DataModule, tiny_cifar).prepare_data()


# -- the in-memory path ------------------------------------------------------------------------


@pytest.mark.parametrize("cls", [MNISTDataModule, CIFAR10DataModule])
def test_in_memory_batches_equal_the_torchvision_path(cls, tiny_mnist, tiny_cifar):
    paths = tiny_mnist if cls is MNISTDataModule else tiny_cifar
    fast = make(cls, paths, val_size=50, batch_size=20, in_memory=True)
    slow = make(cls, paths, val_size=50, batch_size=20)
    fast.prepare_data()
    for stage in ("train_dataloader", "val_dataloader", "test_dataloader"):
        a, b = getattr(fast, stage)(), getattr(slow, stage)()
        assert len(a) == len(b)
        for (xa, ya), (xb, yb) in zip(a, b):
            assert torch.equal(ya, yb)
            assert torch.allclose(xa, xb, atol=1e-5)


def test_in_memory_epochs_cover_every_sample_once_with_fresh_order(tiny_mnist):
    dm = make(MNISTDataModule, tiny_mnist, val_size=100, batch_size=64, in_memory=True)
    dm.prepare_data()
    loader = dm.train_dataloader()
    orders = []
    for epoch in range(2):
        loader.sampler.set_epoch(epoch)
        idx = list(loader.sampler)
        assert sorted(idx) == list(range(500))
        orders.append(idx)
        assert sum(len(y) for _, y in loader) == 500
    assert orders[0] != orders[1]


def test_in_memory_ddp_shards_are_disjoint_and_cover_the_split(tiny_mnist):
    from torch.utils.data import DistributedSampler

    images, targets = torch.zeros(10, 1, 2, 2, dtype=torch.uint8), torch.arange(10)
    seen = []
    for rank in range(2):
        s = DistributedSampler(range(10), num_replicas=2, rank=rank, shuffle=True, seed=3)
        s.set_epoch(1)
        batches = EpochBatches(images, targets, s, batch_size=4, mean=(0.0,), std=(1.0,))
        ys = torch.cat([y for _, y in batches]).tolist()
        assert len(ys) == 5
        seen.append(set(ys))
    assert seen[0].isdisjoint(seen[1]) and seen[0] | seen[1] == set(range(10))


def test_random_crop_flip_shapes_and_bounds():
    x = torch.randint(1, 256, (64, 3, 32, 32), dtype=torch.uint8)
    out = EpochBatches.random_crop_flip(x)
    assert out.shape == x.shape and out.dtype == x.dtype
    # every output image is one 32x32 window of its zero-padded input, flipped or not
    padded = torch.nn.functional.pad(x, (4, 4, 4, 4))
    for i in range(8):
        windows = [padded[i, :, dy : dy + 32, dx : dx + 32] for dy in range(9) for dx in range(9)]
        assert any(torch.equal(out[i], w) or torch.equal(out[i], w.flip(2)) for w in windows), i
    # offsets are uniform in [-4, 4] per axis: the expected share of padding pixels is
    # 1 - (1 - E|d|/32)^2 with E|d| = 20/9, i.e. 0.134 (inputs have no zeros of their own)
    x = torch.randint(1, 256, (512, 3, 32, 32), dtype=torch.uint8)
    share = float((EpochBatches.random_crop_flip(x) == 0).float().mean())
    assert math.isclose(share, 1 - (1 - 20 / 9 / 32) ** 2, abs_tol=0.02)


def test_two_ranks_share_one_split_and_shard_training_disjointly(tiny_mnist):
    """DDP semantics simulated with two data modules standing in for ranks 0 and 1."""
    from types import SimpleNamespace

    make(MNISTDataModule, tiny_mnist).prepare_data()  # once per node, before the ranks set up
    ranks = []
    for rank in range(2):
        dm = make(MNISTDataModule, tiny_mnist, val_size=100, batch_size=10)
        dm.trainer = SimpleNamespace(world_size=2, global_rank=rank, strategy=SimpleNamespace(root_device="cpu"))
        dm.setup("fit")
        split = [t.clone() for t in dm.split]
        dm.setup("test")  # a later stage must not re-split
        assert all(torch.equal(a, b) for a, b in zip(split, dm.split))
        ranks.append(dm)
    assert all(torch.equal(a, b) for a, b in zip(ranks[0].split, ranks[1].split))
    train_idx, val_idx = ranks[0].split
    assert not set(train_idx.tolist()) & set(val_idx.tolist())
    shards = [list(dm.train_dataloader().sampler) for dm in ranks]
    assert set(shards[0]).isdisjoint(shards[1]) and set(shards[0]) | set(shards[1]) == set(range(500))
    evals = [list(dm.test_dataloader().sampler) for dm in ranks]
    assert sorted(evals[0] + evals[1]) == list(range(100))  # every test image once, no padding


def test_hostile_tar_with_the_right_name_never_writes_outside(tiny_cifar, tmp_path, monkeypatch):
    import hashlib
    import io
    import tarfile

    source = tmp_path / "hostile"
    source.mkdir()
    archive = source / "cifar-10-python.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for name in ("../../escaped.txt", "cifar-10-batches-py/batches.meta"):
            info = tarfile.TarInfo(name)
            info.size = 3
            tar.addfile(info, io.BytesIO(b"bad"))
    data = tmp_path / "deep" / "data"
    dm = CIFAR10DataModule(data_dir=str(data), source_dir=str(source), val_size=100)
    with pytest.raises(DataError, match="fails its md5 check"):
        dm.prepare_data()
    assert not (tmp_path / "escaped.txt").exists() and not (tmp_path / "deep").exists()
    # even when its md5 is taken as the published one, the "data" filter refuses the member
    monkeypatch.setattr(CIFAR10DataModule.dataset_cls, "tgz_md5", hashlib.md5(archive.read_bytes()).hexdigest())
    with pytest.raises(DataError, match="could not be extracted"):
        dm.prepare_data()
    assert not (tmp_path / "escaped.txt").exists() and not (tmp_path / "deep").exists()
