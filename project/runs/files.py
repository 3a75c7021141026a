"""Files the product writes, and folders and paths it is given: written whole, never through a link, never outside.

* :func:`atomic_file` / :func:`write_bytes` / :func:`write_text` / :func:`write_json`: a new temporary file
  created exclusively (``O_EXCL``) in the same folder, fsync, atomic rename; a reader sees the old or the new
  file, never a half-written one, and a link planted at the name is replaced, never followed. Given the folder the
  path lies below (``below``: the folder the user gave), every component under it is opened through directory file
  descriptors without following links (:func:`open_below`), at each write, so a folder swapped for a link mid-run
  is caught at the write; a hard-linked target is replaced, never written into.
* :func:`hold_below`: from then on, every write and removal of this process through this module to a path under a
  folder the user gave (a run's logger ``save_dir``, a ``checkpoint.dirpath``) goes through :func:`open_below`,
  whatever the caller passes: one writer for the run folder's files, checkpoints included; :func:`held_dir` gives
  a library that opens files by path itself (TensorBoard's event writer) a folder it cannot be redirected from.
* :func:`check_folder`: a folder the user named can be created and written, one ``error:`` line otherwise.
* :func:`inside`: whether a path read from a file (a checkpoint's state) names a regular file directly in a folder.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from project.errors import ConfigError, LinkOnTheWay


def check_folder(path: str | Path, key: str, write: bool = True, keep: bool = False) -> None:
    """Refuse, before any work, a folder the command must create (or, with ``write``, write into) but cannot.

    The nearest existing ancestor of ``path`` must be a folder this process may write into; a missing ``path``
    is created and removed again to be sure (read-only mounts, ``/proc`` and root's permissions are not told
    by the mode bits; with ``keep`` it stays). An existing folder without ``write`` is accepted as it is
    (read-only data is fine).

    Raises:
        ConfigError: ``key``: ``path`` is a file, lies under a file, or is not writable, naming the fix.
    """
    if "://" in str(path):
        return  # a remote filesystem: its own client reports access errors
    path = Path(path).expanduser().absolute()
    existing = path
    while not existing.exists() and existing.parent != existing:
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError(f"{key}: {path} cannot be a folder: {existing} is a file; choose another folder")
    if existing == path and not write:
        return
    if not os.access(existing, os.W_OK | os.X_OK):
        what = "is not writable" if existing == path else f"cannot be created ({existing} is not writable)"
        raise ConfigError(f"{key}: {path} {what} by this user; choose a folder you can write to, or fix its owner")
    if existing != path:  # permissions do not tell everything (root, read-only mounts, /proc): try, then undo
        try:
            path.mkdir(parents=True, exist_ok=True)  # another process may be creating it at the same moment
        except OSError as e:
            raise ConfigError(f"{key}: {path} cannot be created ({e.strerror}); choose another folder") from None
        if keep:
            return
        while path != existing:
            with contextlib.suppress(OSError):
                path.rmdir()  # only when empty: never a folder another process has started using
            path = path.parent


def inside(folder: str | Path | None, path: Any) -> bool:
    """Whether ``path`` (e.g. read from a checkpoint's state) names a regular file directly inside ``folder``.

    Lexical and on disk: ``..`` components, links (the file or any folder on the way) and other folders are
    all refused, so a path taken from a file can never lead a write or a delete elsewhere.
    """
    if not isinstance(path, str | os.PathLike) or not str(path) or not folder:
        return False
    if "://" in str(folder):  # a remote filesystem: lexical only
        rest = str(path).removeprefix(str(folder).rstrip("/") + "/")
        return rest != str(path) and "/" not in rest and rest not in ("", ".", "..")
    folder, path = Path(folder), Path(path)
    if ".." in path.parts or path.parent != folder:
        return False
    try:
        real_folder = folder.resolve(strict=True)
    except OSError:
        return False
    return not path.is_symlink() and path.resolve().parent == real_folder


_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)
# Folders the user gave that writes below are held to (hold_below), absolute; for the life of the process.
_HELD: list[Path] = []


def hold_below(folder: str | Path) -> None:
    """Hold every later write (:func:`atomic_file` and the writers on it) and removal (:func:`unlink_below`) of this
    process to a path under ``folder`` to :func:`open_below` from ``folder`` down, even where the caller passes no
    ``below``: a run folder, or a component of it, swapped for a symbolic link mid-run is refused at the next write
    rather than followed. ``folder`` is taken as given (it may itself be a link of the user's); a URL is ignored."""
    if "://" in str(folder):
        return
    held = Path(folder).expanduser().absolute()
    if held not in _HELD:
        _HELD.append(held)


def held_root(path: str | Path) -> Path | None:
    """The innermost held folder (:func:`hold_below`) that ``path`` lies below, or ``None``."""
    path = Path(path).absolute()
    roots = [root for root in _HELD if path != root and path.is_relative_to(root)]
    return max(roots, key=lambda root: len(root.parts)) if roots else None


def held_dir(folder: str | Path) -> tuple[str, int | None]:
    """A path by which a library that opens files itself reaches ``folder`` and nothing else: for a folder under a
    held one, ``/proc/self/fd/N`` of a descriptor :func:`open_below` opened (the kernel resolves it to that very
    folder, whatever is swapped on the way later), and that descriptor, which the caller keeps open while the
    path is in use and then closes; else ``(str(folder), None)`` (no ``/proc``, or not under a held folder).

    Raises:
        OSError: a component under the held folder is a link (``ELOOP``) or a file (``ENOTDIR``).
    """
    root = held_root(folder)
    if root is None or not os.path.isdir("/proc/self/fd"):
        return str(folder), None
    fd = open_below(root, folder)
    return f"/proc/self/fd/{fd}", fd


def open_below(below: str | Path, folder: str | Path, create: bool = True) -> int:
    """A file descriptor of ``folder``, reached from ``below`` (which it lies in or is) one component at a time, each
    opened with ``O_NOFOLLOW`` relative to the last (``dir_fd``): a symbolic link at any component under ``below``,
    or a file where a folder should be, is refused, never followed. ``below`` itself is opened as given (the user's
    folder may be a link of theirs). Missing components, ``below`` too, are created (``create``). The caller closes
    the descriptor.

    Raises:
        LinkOnTheWay: (an ``OSError``, ``ELOOP``/``ENOTDIR``) a link or a file at a component, naming it;
            ``ValueError`` when ``folder`` is not below ``below`` or its path climbs with ``..``.
    """
    below, folder = Path(below).absolute(), Path(folder).absolute()
    parts = folder.relative_to(below).parts  # ValueError outside
    if ".." in parts:
        raise ValueError(f"{folder} climbs out of {below}")
    if create:
        below.mkdir(parents=True, exist_ok=True)  # the folder the user gave, as given (e.g. logs/ before a first run)
    fd = os.open(below, _DIR_FLAGS)
    done = below
    try:
        for part in parts:
            done = done / part
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o777, dir_fd=fd)
            child = os.open(part, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = child
    except OSError as e:
        os.close(fd)
        if e.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        raise LinkOnTheWay(
            f"{done}: a symbolic link or a file stands where a folder under {below} should be (swapped in while "
            "a command was writing there?); nothing was written through it: move it away, check what it points "
            "to, and run again",
            e.errno,
        ) from None
    except BaseException:
        os.close(fd)
        raise
    return fd


def new_file_mode() -> int:
    """The mode ``open()`` gives a new file: ``0o666`` less this process's umask (``0o644`` under the usual 022,
    ``0o600`` under 077), read from ``/proc/self/status`` on Linux, else set and restored at once."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return 0o666 & ~int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


@contextlib.contextmanager
def atomic_file(path: str | Path, below: str | Path | None = None) -> Iterator[Any]:
    """A binary file object whose content replaces ``path`` atomically, never through a link, when the block ends.

    The bytes go to a new temporary file that :func:`tempfile.mkstemp` creates exclusively (``O_EXCL``: a link
    or file planted under any name is never opened) in the same folder, are flushed to disk, and the file is
    renamed over ``path`` (``os.replace``, which replaces a link at ``path`` rather than following it), with the
    mode a new file gets under the process's umask (:func:`new_file_mode`). A reader
    sees the old or the new file, never a half-written one, even when the process is killed midway. An error in
    the block removes the temporary file and leaves ``path`` as it was.

    With ``below`` (a folder ``path`` lies in: the one the user gave; default the held folder it lies under,
    :func:`hold_below`), the folders from there to ``path``'s are opened
    (and created) through :func:`open_below`, so no component under ``below`` is followed if it is a link, and the
    temporary file is created and renamed within that directory descriptor.

    Raises:
        OSError: the folder is missing or unwritable, a component under ``below`` is a link (``ELOOP``) or a file
            (``ENOTDIR``), or the disk is full (the temporary file is removed).
    """
    path = Path(path)
    below = below if below is not None else held_root(path)
    if below is not None:
        with _atomic_below(path, below) as f:
            yield f
        return
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, new_file_mode())  # mkstemp's 0600 would hide results from a team sharing logs/
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def _atomic_below(path: Path, below: str | Path) -> Iterator[Any]:
    folder_fd = open_below(below, path.parent)
    try:
        for _ in range(100):  # a free temporary name, created exclusively and never through a link
            tmp = f".{path.name}.{secrets.token_hex(4)}.tmp"
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                             dir_fd=folder_fd)  # fmt: skip
                break
            except FileExistsError:
                continue
        else:
            raise FileExistsError(f"no free temporary name beside {path}")
        try:
            with os.fdopen(fd, "wb") as f:
                yield f
                f.flush()
                os.fsync(f.fileno())
                os.fchmod(f.fileno(), new_file_mode())
            os.replace(tmp, path.name, src_dir_fd=folder_fd, dst_dir_fd=folder_fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=folder_fd)
            raise
    finally:
        os.close(folder_fd)


def write_bytes(path: str | Path, data: bytes, below: str | Path | None = None) -> Path:
    """Write ``data`` to ``path`` through :func:`atomic_file` (with ``below``: no link followed under it); returns
    ``path``."""
    with atomic_file(path, below) as f:
        f.write(data)
    return Path(path)


def write_text(path: str | Path, text: str, below: str | Path | None = None) -> Path:
    """:func:`write_bytes` of ``text`` in UTF-8."""
    return write_bytes(path, text.encode(), below)


def write_json(path: Path, data: dict[str, Any], below: str | Path | None = None) -> Path:
    """Write ``data`` as JSON atomically, never through a link (:func:`write_bytes`); returns ``path``."""
    return write_text(path, json.dumps(data, indent=2) + "\n", below)


def remove_temporaries(path: str | Path) -> None:
    """Remove the temporary files a writer of ``path`` killed midway (``kill -9``) left beside it
    (``.<name>.<random>.tmp``, regular files only; a link or folder of that name stays), through the held folder's
    descriptors when ``path`` lies under one (:func:`hold_below`). Creates ``path``'s folder if missing.

    Raises:
        OSError: a component under the held folder is a link or a file."""
    path = Path(path)
    root = held_root(path)
    if root is None:
        path.parent.mkdir(parents=True, exist_ok=True)
    folder_fd = open_below(root, path.parent) if root is not None else os.open(path.parent, _DIR_FLAGS)
    try:
        for name in os.listdir(folder_fd):
            if name.startswith(f".{path.name}.") and name.endswith(".tmp"):
                with contextlib.suppress(FileNotFoundError):
                    if stat.S_ISREG(os.stat(name, dir_fd=folder_fd, follow_symlinks=False).st_mode):
                        os.unlink(name, dir_fd=folder_fd)
    finally:
        os.close(folder_fd)


def unlink_below(path: str | Path, below: str | Path) -> None:
    """Remove the file ``path`` (if there) without following a link at any component under ``below``
    (:func:`open_below`; a link at the name itself is removed, not what it points to).

    Raises:
        OSError: a component under ``below`` is a link or a file."""
    path = Path(path)
    try:
        folder_fd = open_below(below, path.parent, create=False)
    except FileNotFoundError:
        return
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path.name, dir_fd=folder_fd)
    finally:
        os.close(folder_fd)
