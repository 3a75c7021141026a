"""Files from elsewhere are data: every size or count read from one is checked before memory or disk is spent.

Checkpoints (widths against the weights, tensors against the bytes they hold, zip records against the file),
archives (md5 before decompression, decompression bounded by the published size, CIFAR-10 tar members checked
from their headers) and any number of image files for ``predict``. Each failure is one ``error:`` line, a
non-zero exit, and nothing left behind.
"""

from __future__ import annotations

import csv
import gzip
import io
import random
import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
import torch
from helpers import REPO, own_data, run_dirs, run_main, tiny_args
from PIL import Image

from project import checkpoints, evaluate, export, predict
from project.data.modules import CIFAR10DataModule, MNISTDataModule
from project.errors import ConfigError, DataError

HUGE = {"channels": [20, 50], "hidden": [700_000]}  # LeNet's fc1 alone would be 700,000 x 800 floats: 2.1 GiB


def _best(run):
    return next(p for p in (run / "checkpoints").glob("*.ckpt") if p.name != "last.ckpt")


@pytest.fixture
def no_real_huge_net(monkeypatch):
    """Fail (instead of allocating gigabytes) if a net of :data:`HUGE` widths is built anywhere but on meta."""
    from project import module

    build = module.build_net

    def guarded(name, num_classes=10, widths=None):
        if widths and widths.get("hidden") == HUGE["hidden"] and torch.get_default_device().type != "meta":
            raise AssertionError(f"a {widths} net was allocated from a checkpoint's claim")
        return build(name, num_classes, widths)

    monkeypatch.setattr(module, "build_net", guarded)


def _craft(run, path, expand=False):
    """The run's best checkpoint with hyper_parameters.widths = HUGE; with ``expand``, weights of the HUGE
    shapes that are zero-stride views of one number (the file stays small)."""
    ckpt = torch.load(_best(run), weights_only=True)
    ckpt["hyper_parameters"]["widths"] = HUGE
    if expand:
        sd = ckpt["state_dict"]
        h = HUGE["hidden"][0]
        sd["net.fc1.weight"] = torch.zeros(1).expand(h, 800)
        sd["net.fc1.bias"] = torch.zeros(1).expand(h)
        sd["net.fc2.weight"] = torch.zeros(1).expand(10, h)
    torch.save(ckpt, path)
    assert path.stat().st_size < 4 << 20
    return path


COMMANDS = {
    "evaluate": lambda run, ckpt, tmp: evaluate.main([str(run), *own_data(run), "--ckpt", str(ckpt)]),
    "predict": lambda run, ckpt, tmp: predict.main(
        [str(run), str(tmp / "x.png"), "--ckpt", str(ckpt), "--out", str(tmp / "p.csv")]
    ),
    "export": lambda run, ckpt, tmp: export.main(
        [str(run), "--ckpt", str(ckpt), "--format", "torchscript", "--out", str(tmp / "m.ts.pt")]
    ),
}


@pytest.mark.parametrize("expand", [False, True], ids=["widths", "zero-stride-weights"])
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_checkpoint_claiming_huge_widths_is_refused_before_anything_is_built(
    command, expand, trained_run, no_real_huge_net, tmp_path, capsys
):
    """Issue 23 row 4: a 4 MiB checkpoint whose widths are huge allocated 2.8 GiB before the strict load refused
    it. The widths are now checked on the meta device against the weights (and the weights against the bytes the
    file holds for them) before any net of that shape exists."""
    ckpt = _craft(trained_run, tmp_path / "huge.ckpt", expand)
    Image.new("L", (28, 28)).save(tmp_path / "x.png")
    before = sorted(p.name for p in trained_run.iterdir())
    capsys.readouterr()
    assert COMMANDS[command](trained_run, ckpt, tmp_path) == 2
    err = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert len(err) == 1 and err[0].startswith("error: ") and ckpt.name in err[0], err
    why = "net.fc1.weight claims" if expand else "net.fc1.bias: 500 in the file, 700000 by the hyper-parameters"
    assert why in err[0]
    assert sorted(p.name for p in trained_run.iterdir()) == before
    assert not (tmp_path / "p.csv").exists() and not (tmp_path / "m.ts.pt").exists()


@pytest.mark.parametrize("claim", [{"widths": HUGE}, {"num_classes": 200_000}], ids=["widths", "num_classes"])
def test_load_from_checkpoint_refuses_huge_hyper_parameters_before_building(claim, trained_run, tmp_path, monkeypatch):
    """``ImageClassifier.load_from_checkpoint`` builds the module from the file's hyper-parameters before any hook:
    200,000 classes would be a 200,000 x 500 output layer and a 200,000^2 confusion matrix (320 GB)."""
    from project import module
    from project.errors import ConfigError
    from project.module import ImageClassifier

    def refuse(self, *args, **kwargs):  # fail instead of allocating
        raise AssertionError(f"ImageClassifier built from a checkpoint's claim {claim}")

    ckpt = torch.load(_best(trained_run), weights_only=True)
    ckpt["hyper_parameters"].update(claim)
    torch.save(ckpt, tmp_path / "huge.ckpt")
    monkeypatch.setattr(module.ImageClassifier, "__init__", refuse)
    with pytest.raises(ConfigError, match=r"huge.ckpt: hyper_parameters.* do not match its weights \(net.fc"):
        ImageClassifier.load_from_checkpoint(tmp_path / "huge.ckpt", map_location="cpu")


RSS_GROWTH = """
import os, sys
import torch  # imported before measuring: project.runs imports it only when a checkpoint is loaded
from project import checkpoints


def rss_kib():  # resident memory now (Linux)
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") >> 10


before = rss_kib()
try:
    kept = checkpoints.load_checkpoint(sys.argv[1])
except Exception as e:
    print("refused:", " ".join(str(e).split()))
print("grew_kib", rss_kib() - before)
"""


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm")
def test_checkpoint_with_deflated_records_is_refused_before_it_is_inflated(trained_run, tmp_path):
    """``torch.save`` stores records uncompressed, but ``torch.load`` also inflates deflated ones: a 128 MiB tensor
    of zeros adds a few hundred KiB to a file, and loading it took 128 MiB. Untrusted checkpoints must be zips of
    stored records no larger than the file, so loading one takes no more memory than its size."""
    ckpt = torch.load(_best(trained_run), weights_only=True)
    ckpt["state_dict"]["net.extra"] = torch.zeros(32 << 20)  # 128 MiB
    stored, bomb = tmp_path / "stored.ckpt", tmp_path / "bomb.ckpt"
    torch.save(ckpt, stored)
    with zipfile.ZipFile(stored) as src, zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as out:
        for info in src.infolist():
            out.writestr(info.filename, src.read(info.filename))
    stored.unlink()
    assert bomb.stat().st_size < 4 << 20  # the run's own weights (1.7 MiB) barely compress
    out = subprocess.run(
        [sys.executable, "-c", RSS_GROWTH, str(bomb)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"},
    )
    lines = out.stdout.splitlines()
    assert lines[0].startswith("refused:") and "bomb.ckpt" in lines[0] and "compressed" in lines[0], out
    assert int(lines[-1].split()[1]) < 32 << 10, lines  # KiB: far below the 128 MiB tensor


def _forged_zip(path: Path, compress: int, declare: int | None = None) -> Path:
    """A one-record zip (4 KiB of random bytes: deflating them does not shrink them) written with ``compress``;
    ``declare`` forges the uncompressed size its central directory gives (what ``ZipFile.infolist`` reads)."""
    with zipfile.ZipFile(path, "w", compress) as out:
        out.writestr("archive/data/0", random.Random(0).randbytes(4096))
    if declare is not None:
        raw = bytearray(path.read_bytes())
        at = raw.index(b"PK\x01\x02") + 24  # central directory header: uncompressed size, little-endian uint32
        raw[at : at + 4] = declare.to_bytes(4, "little")
        path.write_bytes(bytes(raw))
    return path


@pytest.mark.parametrize(
    ("compress", "declare", "why"),
    [
        (zipfile.ZIP_DEFLATED, None, "record archive/data/0 is compressed"),  # compressed, declares less than the file
        (zipfile.ZIP_STORED, 1 << 30, f"its records declare {1 << 30} bytes"),  # stored, yet declares 1 GiB
    ],
)
def test_checkpoint_zip_records_are_each_checked_on_their_own(tmp_path, compress, declare, why):
    """Either fault alone refuses a checkpoint before it is read: a compressed record, or records declaring more
    bytes than the file holds (the two limits of ``checkpoints.check_zip_records``)."""
    path = _forged_zip(tmp_path / "forged.ckpt", compress, declare)
    assert ((declare or 4096) > path.stat().st_size) == (declare is not None)  # each case holds one fault only
    with pytest.raises(ConfigError, match=re.escape(why)):
        checkpoints.check_zip_records(path)
    checkpoints.check_zip_records(_forged_zip(tmp_path / "plain.ckpt", zipfile.ZIP_STORED))  # the honest file passes


# -- archives --------------------------------------------------------------------------------------------------


@pytest.fixture
def read_counter(monkeypatch):
    """Counts the bytes every ``gzip`` reader decompresses."""
    count = {"bytes": 0}
    read = gzip.GzipFile.read

    def counting(self, size=-1):
        data = read(self, size)
        count["bytes"] += len(data)
        return data

    monkeypatch.setattr(gzip.GzipFile, "read", counting)
    return count


def test_gzip_bomb_in_source_dir_is_not_decompressed_past_the_published_size(tiny_mnist, read_counter):
    """Issue 23 row 5: a small train-images-idx3-ubyte.gz decompressing to far more than the original was written
    whole into data_dir before failing its md5 check. It fails the archive md5 first; decompressing its content
    then stops one byte past the published size, and nothing is left."""
    path = tiny_mnist["source"] / "train-images-idx3-ubyte.gz"
    expected = len(gzip.decompress(path.read_bytes()))
    path.write_bytes(gzip.compress(bytes(64 << 20), compresslevel=9, mtime=0))  # 64 MiB of zeros, ~64 KiB
    dm = MNISTDataModule(data_dir=str(tiny_mnist["data"]), source_dir=str(tiny_mnist["source"]), val_size=100)
    with pytest.raises(DataError, match=rf"train-images-idx3-ubyte.gz fails its md5 check .* more than the {expected}"):
        dm.prepare_data()
    assert read_counter["bytes"] <= expected + 1, read_counter
    assert not tiny_mnist["data"].exists()


@pytest.mark.parametrize("change", ["shorter", "longer"])
def test_recompressed_archive_of_other_content_is_refused_and_leaves_nothing(change, tiny_mnist, read_counter):
    path = tiny_mnist["source"] / "t10k-labels-idx1-ubyte.gz"
    raw = gzip.decompress(path.read_bytes())
    raw = raw[:-10] if change == "shorter" else raw + bytes(10 << 20)
    path.write_bytes(gzip.compress(raw, compresslevel=1, mtime=1))
    dm = MNISTDataModule(data_dir=str(tiny_mnist["data"]), source_dir=str(tiny_mnist["source"]), val_size=100)
    with pytest.raises(DataError, match="t10k-labels-idx1-ubyte.gz fails its md5 check .* decompresses to"):
        dm.prepare_data()
    assert not tiny_mnist["data"].exists()
    assert read_counter["bytes"] < 4 << 20  # every archive decompressed, none past its published size


def test_gzip_bomb_through_fit_is_one_error_line(tiny_mnist, tmp_path, monkeypatch, capsys):
    (tiny_mnist["source"] / "train-images-idx3-ubyte.gz").write_bytes(gzip.compress(bytes(16 << 20), mtime=0))
    monkeypatch.chdir(tmp_path)
    assert run_main(tiny_args(tiny_mnist, tmp_path / "logs")) == 1
    err = [x for x in capsys.readouterr().err.splitlines() if x.startswith("error:")]
    assert len(err) == 1 and "train-images-idx3-ubyte.gz" in err[0] and "more than" in err[0], err
    assert not tiny_mnist["data"].exists() and run_dirs(tmp_path / "logs") == []


def _cifar_with(tiny_cifar, tmp_path, monkeypatch, extra):
    """The tiny CIFAR-10 archive's members plus ``extra`` (name, TarInfo-setup, bytes) ones, md5 published."""
    import hashlib

    good = tarfile.open(tiny_cifar["source"] / "cifar-10-python.tar.gz")
    source = tmp_path / "hostile"
    source.mkdir()
    archive = source / "cifar-10-python.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for member in good.getmembers():
            tar.addfile(member, good.extractfile(member) if member.isreg() else None)
        for info, data in extra:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    monkeypatch.setattr(CIFAR10DataModule.dataset_cls, "tgz_md5", hashlib.md5(archive.read_bytes()).hexdigest())
    return source


def _info(name, size=0, kind=tarfile.REGTYPE, link=""):
    info = tarfile.TarInfo(name)
    info.size, info.type, info.linkname = size, kind, link
    return info


@pytest.mark.parametrize(
    "extra, why",
    [
        ([(_info("cifar-10-batches-py", kind=tarfile.DIRTYPE), None)] * 40, "more than 16 members"),
        (
            [(_info("cifar-10-batches-py/readme.html", kind=tarfile.SYMTYPE, link="data_batch_1"), None)],
            "'cifar-10-batches-py/readme.html' is not a file",
        ),
        ([(_info("cifar-10-batches-py/extra.bin", 3), b"abc")], "'cifar-10-batches-py/extra.bin' is not a file"),
        ([(_info("cifar-10-batches-py/data_batch_1", 3), b"abc")], "(twice)"),
    ],
    ids=["many-members", "link", "other-file", "duplicate"],
)
def test_cifar_archive_members_are_checked_from_their_headers(extra, why, tiny_cifar, tmp_path, monkeypatch):
    """Even an archive that passes the md5 check (here: declared the published one) extracts only the folder and
    the files CIFAR-10's archive holds, regular files, once each, at most 16 members, into a temporary folder."""
    source = _cifar_with(tiny_cifar, tmp_path, monkeypatch, extra)
    data = tmp_path / "deep" / "data"
    dm = CIFAR10DataModule(data_dir=str(data), source_dir=str(source), val_size=100)
    with pytest.raises(DataError, match="could not be extracted") as e:
        dm.prepare_data()
    assert why in str(e.value)
    assert not (tmp_path / "deep").exists()


def test_cifar_member_larger_than_any_published_file_is_refused_from_its_header(tiny_cifar, tmp_path, monkeypatch):
    from project.data import archives

    monkeypatch.setattr(archives, "CIFAR_MAX_MEMBER_BYTES", 1000, raising=False)  # the tiny batches are ~300 KB
    source = _cifar_with(tiny_cifar, tmp_path, monkeypatch, [])
    dm = CIFAR10DataModule(data_dir=str(tmp_path / "data"), source_dir=str(source), val_size=100)
    with pytest.raises(DataError, match=r"could not be extracted \('cifar-10-batches-py/\w+' declares \d+ bytes"):
        dm.prepare_data()
    assert not (tmp_path / "data").exists()


# -- any number of image files -----------------------------------------------------------------------------------


@pytest.mark.slow
def test_predict_classifies_any_number_of_files_with_workers(trained_run, tmp_path, capsys):
    """Issue 23 row 6: 300 PNGs with data.num_workers 2 crashed ("too many open files": the decoded tensors were
    sent to each worker with one file descriptor apiece, and Linux passes at most 253 per message); no CSV.
    Now the dataset holds paths and workers read each file when asked."""
    folder = tmp_path / "many"
    folder.mkdir()
    for i in range(300):
        Image.new("L", (28, 28), color=i % 256).save(folder / f"{i:03d}.png")
    out = tmp_path / "preds.csv"
    code = predict.main(
        [str(trained_run), str(folder), "--out", str(out), "--data.num_workers", "2", "--data.batch_size", "64"]
    )
    assert code == 0, capsys.readouterr().err
    rows = list(csv.DictReader(out.open()))
    assert [r["path"].rsplit("/", 1)[-1] for r in rows] == [f"{i:03d}.png" for i in range(300)]
    # the same bytes give the same prediction, whichever worker and batch read them
    by_shade = {}
    for i, r in enumerate(rows):
        by_shade.setdefault(i % 256, set()).add((r["pred"], r["prob"]))
    assert all(len(v) == 1 for v in by_shade.values())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["many", "preds.csv"]  # no temporary file left
