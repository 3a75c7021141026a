"""Data integrity and offline import: the original archives in, verified torchvision-layout files out.

* MNIST family: ``train-images-idx3-ubyte.gz`` and friends are md5-checked (torchvision's published
  sums) before they are decompressed into ``<data_dir>/<Dataset>/raw/``. An archive that fails its md5 may
  still be a re-compressed copy of the published files (Debian's ``dataset-fashion-mnist`` is one): it is
  accepted when its *content* has the published md5 and size (:data:`RAW_MD5`, :data:`RAW_SIZES`). Its
  content is streamed through md5 into a temporary file and decompression stops as soon as it passes the
  published size, so a small archive that decompresses to gigabytes (a "gzip bomb") costs at most that size
  of disk and a bounded buffer of memory. IDX files are checked by size from their header on every setup
  and by md5 in ``prepare_data`` -- torchvision checks them only at download time.
* CIFAR-10: ``cifar-10-python.tar.gz`` is md5-checked, then its members are read one by one: only the folder
  ``cifar-10-batches-py/`` and the files torchvision lists (plus ``readme.html``) are accepted, each a regular
  file of at most :data:`CIFAR_MAX_MEMBER_BYTES`, at most :data:`CIFAR_MAX_MEMBERS` members, checked from
  each member's header before its data is written; they are extracted with ``tarfile``'s ``"data"`` filter
  (no absolute paths, no ``..``, no links, no devices) into a temporary folder that is renamed into place.
  torchvision's own ``extract_archive`` does neither, so it is not used for archives that come from elsewhere.

md5 sums are computed with ``torchvision.datasets.utils.calculate_md5``. Every write goes through a
temporary file or folder and an atomic rename, and a failed import removes the folders it created.

Around them: :func:`preparation_lock` serialises preparation of one ``data_dir`` on shared storage, and
:func:`download_with_torchvision` is the online source (``data.download: true``).
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import logging
import math
import os
import shutil
import tarfile
import tempfile
import zlib
from collections.abc import Iterator
from pathlib import Path

from filelock import FileLock, Timeout
from torchvision import datasets
from torchvision.datasets.utils import calculate_md5

from project.errors import DataError

log = logging.getLogger(__name__)

# md5 of the *extracted* IDX files. torchvision publishes md5 sums of the .gz archives only; these
# let us verify extracted files and accept archives that were re-compressed (e.g. by a distribution
# package) but hold the published bytes.
RAW_MD5: dict[str, dict[str, str]] = {
    "MNIST": {
        "train-images-idx3-ubyte": "6bbc9ace898e44ae57da46a324031adb",
        "train-labels-idx1-ubyte": "a25bea736e30d166cdddb491f175f624",
        "t10k-images-idx3-ubyte": "2646ac647ad5339dbf082846283269ea",
        "t10k-labels-idx1-ubyte": "27ae3e4e09519cfbb04c329615203637",
    },
    "FashionMNIST": {
        "train-images-idx3-ubyte": "f4a8712d7a061bf5bd6d2ca38dc4d50a",
        "train-labels-idx1-ubyte": "9018921c3c673c538a1fc5bad174d6f9",
        "t10k-images-idx3-ubyte": "8181f5470baa50b63fa0f6fddb340f0a",
        "t10k-labels-idx1-ubyte": "15d484375f8d13e6eb1aabb0c3f46965",
    },
}

# Sizes in bytes of the extracted IDX files (the same for both data sets): the most a re-compressed archive may
# decompress to.
RAW_SIZES: dict[str, dict[str, int]] = {
    name: {
        "train-images-idx3-ubyte": 47_040_016,
        "train-labels-idx1-ubyte": 60_008,
        "t10k-images-idx3-ubyte": 7_840_016,
        "t10k-labels-idx1-ubyte": 10_008,
    }
    for name in ("MNIST", "FashionMNIST", "KMNIST")
}

# The published CIFAR-10 archive holds its folder and 8 files, the largest 31 MB.
# CIFAR-100's holds its folder and 4 files (``file.txt~`` among them), the largest (``train``) 155 MB.
CIFAR_MAX_MEMBERS = 16
CIFAR_MAX_MEMBER_BYTES = 64 << 20
CIFAR100_MAX_MEMBER_BYTES = 192 << 20
CIFAR_EXTRA_FILES = ("readme.html", "file.txt~")  # in the published archives beside the data files

FIX = (
    "delete it and run again with data.download: true, or set data.source_dir to a folder holding the original archives"
)

_IDX_ITEMSIZE = {0x08: 1, 0x09: 1, 0x0B: 2, 0x0C: 4, 0x0D: 4, 0x0E: 8}


def check_idx_size(path: Path) -> None:
    """Check that an IDX file (LeCun's MNIST format) is as long as its header says.

    Raises:
        DataError: bad magic number, or the file is shorter or longer than
            ``header + prod(dims) * itemsize`` bytes.
    """
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(4)
        if len(head) < 4 or head[0] != 0 or head[1] != 0 or head[2] not in _IDX_ITEMSIZE:
            raise DataError(f"{path} is not an IDX file (bad magic number); {FIX}")
        ndim = head[3]
        dims_raw = f.read(4 * ndim)
    if len(dims_raw) < 4 * ndim:
        raise DataError(f"{path} is truncated ({size} bytes, header incomplete); {FIX}")
    dims = [int.from_bytes(dims_raw[4 * i : 4 * i + 4], "big") for i in range(ndim)]
    expected = 4 + 4 * ndim + math.prod(dims) * _IDX_ITEMSIZE[head[2]]
    if size != expected:
        raise DataError(f"{path} is truncated or corrupt ({size} bytes, its header says {expected}); {FIX}")


def check_md5(path: Path, expected: str) -> None:
    """Raise :class:`DataError` naming ``path`` when it is missing or its md5 is not ``expected``."""
    if not path.is_file():
        raise DataError(f"{path} is missing; {FIX}")
    if (got := calculate_md5(path)) != expected:
        raise DataError(f"{path} fails its md5 check (got {got}, expected {expected}); {FIX}")


@contextlib.contextmanager
def created_dirs(target: Path) -> Iterator[None]:
    """Remove, on failure, the folders that did not exist before (``target`` and its missing parents).

    A failed import or download then leaves the filesystem as it found it: no empty ``data/MNIST/raw``.
    """
    missing = [p for p in (target, *target.parents) if not p.exists()]
    try:
        yield
    except BaseException:
        for p in missing:  # deepest first
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
        raise


@contextlib.contextmanager
def preparation_lock(data_dir: Path) -> Iterator[None]:
    """Hold ``<data_dir>/.prepare.lock`` (``filelock``) while preparing ``data_dir``, which must exist.

    Serialises preparation on storage shared by several nodes or jobs (needs a file system with working
    ``flock``, as NFSv4 and most cluster file systems have): one process imports, the others wait and then find
    the files. A lock file this process created is removed when the body fails, so the folder is left as it was;
    waiters then try themselves (safely: writes are atomic).
    """
    lock_path = data_dir / ".prepare.lock"
    lock_existed = lock_path.exists()
    lock = FileLock(lock_path)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        log.info("waiting for another process preparing %s (lock %s)", data_dir, lock.lock_file)
        lock.acquire()
    try:
        yield
    except BaseException:
        if not lock_existed:
            lock_path.unlink(missing_ok=True)
        raise
    finally:
        lock.release()


def download_with_torchvision(
    dataset_cls: type[datasets.VisionDataset], data_dir: Path, archive_names: list[str]
) -> None:
    """torchvision's own download (with its md5 checks) of the training and test sets into ``data_dir``.

    Raises:
        DataError: the download failed: its last line, the ``archive_names`` expected and the offline fix
            (``data.source_dir``). torchvision's per-mirror lines go into that message only, not to the console.
    """
    out = io.StringIO()
    try:
        # torchvision prints one line per mirror tried; keep them for the error message only.
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            for train in (True, False):
                dataset_cls(str(data_dir), train=train, download=True)
    except Exception as e:
        first = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
        raise DataError(
            f"downloading {dataset_cls.__name__} failed ({first}). Expected files: {', '.join(archive_names)}. "
            f"Without network access, put those original archives in a folder and set data.source_dir to it"
        ) from None


def _decompress_bounded(archive: Path, target: Path, size: int, md5: str | None) -> str:
    """Decompress the gzip ``archive`` into ``target`` through a temporary file, never past ``size`` bytes; the
    file is renamed into place only when the content has this ``md5`` (any content of ``size`` bytes with ``None``:
    the archive itself was checked).

    Returns:
        the md5 of the content, which is exactly ``size`` bytes; nothing is left on disk unless it is ``md5``.

    Raises:
        DataError: not a gzip archive, or its content is shorter or longer than ``size`` bytes (decompression
            stops at the first byte past it). The message is the reason only, to follow the archive's name.
    """
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    digest = hashlib.md5(usedforsecurity=False)
    written = 0
    try:
        with os.fdopen(fd, "wb") as out, gzip.open(archive, "rb") as f:
            while chunk := f.read(min(1 << 20, size + 1 - written)):
                written += len(chunk)
                if written > size:
                    raise DataError(f"decompresses to more than the {size} bytes of the original {target.name}")
                digest.update(chunk)
                out.write(chunk)
        if written != size:
            raise DataError(f"decompresses to {written} bytes, not the {size} of the original {target.name}")
        if md5 is None or digest.hexdigest() == md5:
            os.replace(tmp, target)
    except (OSError, EOFError, zlib.error) as e:
        raise DataError(f"is not a valid gzip archive ({e})") from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return digest.hexdigest()


def require_archives(source_dir: Path, names: list[str], what: str) -> None:
    """Raise :class:`DataError` listing the archives ``source_dir`` lacks."""
    missing = [name for name in names if not (source_dir / name).is_file()]
    if missing:
        raise DataError(
            f"data.source_dir {source_dir} lacks {', '.join(missing)}; it must hold the original {what} "
            f"archives {', '.join(names)}"
        )


def import_idx_archives(dataset_cls: type[datasets.MNIST], source_dir: Path, raw_folder: Path) -> None:
    """Decompress the MNIST-family ``.gz`` archives of ``source_dir`` into ``raw_folder`` (md5-checked first).

    Each archive's md5 is checked before it is decompressed; one that fails it is decompressed only up to the
    published size of its content (:data:`RAW_SIZES`) and kept only when that content has the published md5
    (a re-compressed copy).

    Raises:
        DataError: an archive is missing, is not gzip, or neither it nor its content matches the published md5
            and size; nothing of it is left in ``raw_folder``.
    """
    names = [name for name, _ in dataset_cls.resources]
    require_archives(source_dir, names, dataset_cls.__name__)
    raw_sizes = RAW_SIZES[dataset_cls.__name__]
    if dataset_cls.__name__ not in RAW_MD5:
        _import_kept_archives(dataset_cls, source_dir, raw_folder, raw_sizes)
        return
    raw_md5 = RAW_MD5[dataset_cls.__name__]
    with created_dirs(raw_folder):
        raw_folder.mkdir(parents=True, exist_ok=True)
        for name, archive_md5 in dataset_cls.resources:
            archive, target = source_dir / name, raw_folder / name.removesuffix(".gz")
            got_archive = calculate_md5(archive)
            mismatch = f"{archive} fails its md5 check (archive md5 {got_archive}, expected {archive_md5}"
            try:
                got = _decompress_bounded(archive, target, raw_sizes[target.name], raw_md5[target.name])
            except DataError as e:
                why = f"{archive} {e}" if got_archive == archive_md5 else f"{mismatch}) and {e}"
                raise DataError(f"{why}; replace it with the original file") from None
            if got != raw_md5[target.name]:
                raise DataError(
                    f"{mismatch}; content md5 {got}, expected {raw_md5[target.name]}); "
                    "replace it with the original file"
                )
            if got_archive != archive_md5:
                log.info("%s is a re-compressed copy; its content matches the published md5", archive)


def _import_kept_archives(
    dataset_cls: type[datasets.MNIST], source_dir: Path, raw_folder: Path, raw_sizes: dict[str, int]
) -> None:
    """:func:`import_idx_archives` for a data set whose content md5 is not published (KMNIST: torchvision lists the
    archives' md5 only): each archive must have its published md5 exactly (a re-compressed copy cannot be told
    from another content), is decompressed bounded by the IDX size, and is kept beside its content in
    ``raw_folder``, as torchvision's own download keeps it, so that :func:`check_against_archive` can check the
    content later.

    Raises:
        DataError: an archive fails its md5 check or does not decompress to the published size; nothing of it is
            left in ``raw_folder``.
    """
    with created_dirs(raw_folder):
        raw_folder.mkdir(parents=True, exist_ok=True)
        for name, archive_md5 in dataset_cls.resources:
            archive, target = source_dir / name, raw_folder / name.removesuffix(".gz")
            if (got := calculate_md5(archive)) != archive_md5:
                raise DataError(
                    f"{archive} fails its md5 check (got {got}, expected {archive_md5}); {dataset_cls.__name__} "
                    "publishes no md5 of the decompressed files, so only the original archive is accepted"
                )
            try:
                _decompress_bounded(archive, target, raw_sizes[target.name], None)
            except DataError as e:
                raise DataError(f"{archive} {e}; replace it with the original file") from None
            if archive.resolve() != (raw_folder / name).resolve():  # kept: the content's reference
                fd, tmp = tempfile.mkstemp(dir=raw_folder, prefix=f".{name}.", suffix=".tmp")
                try:
                    with os.fdopen(fd, "wb") as out, open(archive, "rb") as f:
                        shutil.copyfileobj(f, out)
                    os.replace(tmp, raw_folder / name)
                finally:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(tmp)


def check_against_archive(path: Path, archive: Path, archive_md5: str) -> None:
    """Check an extracted IDX file whose md5 is not published against the archive it came from, kept beside it:
    the archive must have its published md5, and ``path`` must be exactly its decompressed content (compared by
    md5, decompression bounded by ``path``'s size).

    Raises:
        DataError: the archive is missing or fails its md5 check, or ``path`` is not its content.
    """
    if not archive.is_file():
        raise DataError(f"{archive} is missing (kept to check {path.name} against); {FIX}")
    if (got := calculate_md5(archive)) != archive_md5:
        raise DataError(f"{archive} fails its md5 check (got {got}, expected {archive_md5}); {FIX}")
    size = path.stat().st_size
    digest = hashlib.md5(usedforsecurity=False)
    written = 0
    try:
        with gzip.open(archive, "rb") as f:
            while chunk := f.read(min(1 << 20, size + 1 - written)):
                written += len(chunk)
                digest.update(chunk)
                if written > size:
                    break
    except (OSError, EOFError, zlib.error) as e:
        raise DataError(f"{archive} is not a valid gzip archive ({e}); {FIX}") from None
    if written != size or digest.hexdigest() != calculate_md5(path):
        raise DataError(f"{path} is not the content of {archive.name} (md5 or size differ); {FIX}")


def import_cifar_archive(dataset_cls: type[datasets.CIFAR10], source_dir: Path, data_dir: Path) -> None:
    """Extract ``cifar-10-python.tar.gz`` (CIFAR-100: ``cifar-100-python.tar.gz``) from ``source_dir`` into
    ``data_dir/cifar-10-batches-py`` (``cifar-100-python``).

    The archive's md5 is checked before anything is extracted; extraction uses the ``"data"`` filter.

    Raises:
        DataError: the archive is missing, fails its md5 check, cannot be extracted or lacks the folder.
    """
    require_archives(source_dir, [dataset_cls.filename], dataset_cls.__name__.replace("CIFAR", "CIFAR-") + " python")
    archive = source_dir / dataset_cls.filename
    if (got := calculate_md5(archive)) != dataset_cls.tgz_md5:
        raise DataError(
            f"{archive} fails its md5 check (got {got}, expected {dataset_cls.tgz_md5}); "
            "replace it with the original file"
        )
    base = data_dir / dataset_cls.base_folder
    with created_dirs(data_dir):
        data_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=data_dir, prefix=".extract-") as tmp:
            try:
                _extract_cifar_members(archive, dataset_cls, Path(tmp))
            except (tarfile.TarError, OSError, EOFError, zlib.error) as e:
                raise DataError(f"{archive} could not be extracted ({e}); replace it with the original file") from None
            extracted = Path(tmp) / dataset_cls.base_folder
            if not extracted.is_dir():
                raise DataError(
                    f"{archive} holds no {dataset_cls.base_folder}/ folder; replace it with the original file"
                )
            if base.exists():
                shutil.rmtree(base)
            os.replace(extracted, base)


def _extract_cifar_members(archive: Path, dataset_cls: type[datasets.CIFAR10], dest: Path) -> None:
    """Extract the CIFAR-10 (or CIFAR-100) files of ``archive`` into ``dest``, checking each member's header first.

    Raises:
        DataError: more than :data:`CIFAR_MAX_MEMBERS` members, a member that is not the folder or one of its
            files (a link, a device, another path), a file twice, or a file over :data:`CIFAR_MAX_MEMBER_BYTES`
            (CIFAR-100: :data:`CIFAR100_MAX_MEMBER_BYTES`).
    """
    base = dataset_cls.base_folder
    files = [name for name, _ in dataset_cls.train_list + dataset_cls.test_list]
    allowed = {f"{base}/{name}" for name in [*files, dataset_cls.meta["filename"], *CIFAR_EXTRA_FILES]}
    limit = CIFAR100_MAX_MEMBER_BYTES if dataset_cls.__name__ == "CIFAR100" else CIFAR_MAX_MEMBER_BYTES
    what = dataset_cls.__name__.replace("CIFAR", "CIFAR-")
    seen: set[str] = set()
    with tarfile.open(archive, "r:gz") as tar:
        for count, member in enumerate(tar, 1):  # headers are read one at a time, before each member's data
            name = member.name.removeprefix("./").rstrip("/")
            why = None
            if count > CIFAR_MAX_MEMBERS:
                why = f"more than {CIFAR_MAX_MEMBERS} members"
            elif member.isdir() and name == base:
                continue
            elif not member.isreg() or name not in allowed or name in seen:
                why = f"{member.name!r} is not a file of {what}'s archive" + (" (twice)" if name in seen else "")
            elif member.size > limit:
                why = f"{member.name!r} declares {member.size} bytes, more than {limit}"
            if why:
                raise DataError(f"{archive} could not be extracted ({why}); replace it with the original file")
            seen.add(name)
            tar.extract(member, dest, filter="data")
