"""Files from elsewhere, read as data: the one bounded reader for what a run folder or a logs folder holds.

A run folder may have been copied, unpacked or shared by anyone, so every file the product reads from one as data
(``results.json``, ``config.yaml`` and ``config-resume-<k>.yaml``, ``metrics.csv``, a sweep trial's ``trial.json``,
``pruned.json`` and log, the TensorBoard event files ``summarize`` falls back to) goes through this module:

* **regular files only**: ``os.stat`` before opening (a folder, FIFO, socket or device is refused without being
  opened), the open is ``O_NONBLOCK`` (a FIFO swapped in meanwhile never blocks it) and ``os.fstat`` checks again
  what was opened. Links are followed as before, except where a caller says ``follow_links=False`` (then a
  symbolic link is refused, ``O_NOFOLLOW``);
* **a size limit per kind**, checked before reading: :data:`JSON_BYTES`, :data:`YAML_BYTES`, :data:`CSV_BYTES`,
  :data:`EVENTS_BYTES`; at most one byte over the limit is ever read (a file that grows meanwhile is refused);
* **UTF-8**, strictly;
* **JSON** nested at most :data:`MAX_DEPTH` arrays/objects deep (a deeper document is refused, never a
  ``RecursionError``), with non-finite numbers (``NaN``, ``Infinity``, ``-Infinity``, ``1e999``) read as ``None``,
  the way ``summary.json`` writes them;
* **YAML** with the safe loader (libyaml's where installed), refused when its tree, aliases expanded, has more than
  :data:`YAML_NODES` nodes (an alias bomb: 468 bytes can stand for 10^8 nodes), nests deeper than
  :data:`MAX_DEPTH`, or holds an alias inside its own anchor. The tree is measured on the parsed node graph, each
  node once (memoised on node identity), before anything is built from it;
* **CSV** cells up to the ``csv`` module's ``field_size_limit`` (131,072 characters, 128 KiB, by default).

Every failure is one :class:`~project.errors.UnreadableFile` (a :class:`~project.errors.ConfigError`), whose
message is one line: ``<file>: <problem>``, control characters of a hostile file name escaped.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import stat
from pathlib import Path
from typing import Any

import yaml

from project.errors import UnreadableFile, yaml_problem

MiB = 1 << 20
JSON_BYTES = 16 * MiB  # results.json, trial.json, pruned.json: a finished run's results.json is about 10 KiB
YAML_BYTES = 4 * MiB  # a run's config.yaml / config-resume-<k>.yaml: about 5 KiB
CSV_BYTES = 16 * MiB  # metrics.csv: one row per epoch, about 300 bytes a row
EVENTS_BYTES = 256 * MiB  # one TensorBoard event file, checked by size only (TensorBoard's own loader reads it)
MAX_DEPTH = 64  # arrays/objects (JSON) or sequences/mappings (YAML) inside one another; a run's config nests ~8
YAML_NODES = 1_000_000  # nodes of a YAML document as a tree, aliases expanded: a run's config has about 300

# yaml's safe loader, in C where libyaml is there (the pure-Python one is slower: docs/decisions.md)
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

_KINDS = {
    stat.S_IFDIR: "a folder",
    stat.S_IFIFO: "a FIFO (named pipe)",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFLNK: "a symbolic link",
}


def printable(text: object) -> str:
    """``text`` with every control character escaped (``\\n`` as the two characters ``\\`` ``n``): a file name
    from a hostile folder can never break a message into lines."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(text))


def unreadable(path: str | Path, problem: str) -> UnreadableFile:
    """The error for ``path``: one line, ``<path>: <problem>``."""
    return UnreadableFile(printable(f"{path}: {problem}"))


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= MiB and n % MiB == 0 else f"{n:,} bytes"


def _check(path: str | Path, info: os.stat_result, limit: int | None, what: str) -> None:
    if not stat.S_ISREG(info.st_mode):
        kind = _KINDS.get(stat.S_IFMT(info.st_mode), "not a file")
        why = ", not followed" if stat.S_ISLNK(info.st_mode) else ""
        raise unreadable(path, f"is {kind}{why}; {what} is read only from a regular file")
    if limit is not None and info.st_size > limit:
        raise unreadable(path, f"is {info.st_size:,} bytes, over the {_size(limit)} limit for {what}")


def _open(path: str | Path, limit: int | None, what: str, follow_links: bool) -> int:
    """A file descriptor of the regular file ``path``, checked before and after opening (see the module doc)."""
    try:
        _check(path, os.stat(path) if follow_links else os.lstat(path), limit, what)
        flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | (0 if follow_links else os.O_NOFOLLOW)
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise unreadable(path, "does not exist") from None
    except OSError as e:
        raise unreadable(path, f"cannot be opened ({e.strerror})") from None
    try:
        _check(path, os.fstat(fd), limit, what)  # what was opened, should the name have been swapped meanwhile
    except BaseException:
        os.close(fd)
        raise
    return fd


def check_file(path: str | Path, limit: int, what: str = "this file", follow_links: bool = True) -> None:
    """Check, without opening it, that ``path`` is a regular file of at most ``limit`` bytes: for a file another
    library reads (TensorBoard's event files).

    Raises:
        UnreadableFile: missing, not a regular file, or larger than ``limit`` bytes.
    """
    try:
        info = os.stat(path) if follow_links else os.lstat(path)
    except FileNotFoundError:
        raise unreadable(path, "does not exist") from None
    except OSError as e:
        raise unreadable(path, f"cannot be read ({e.strerror})") from None
    _check(path, info, limit, what)


def read_bytes(path: str | Path, limit: int, what: str = "this file", follow_links: bool = True) -> bytes:
    """The content of the regular file ``path``, at most ``limit`` bytes.

    ``what`` names the file's kind in messages (``"results.json"``); with ``follow_links=False`` a symbolic link
    at ``path`` is refused.

    Raises:
        UnreadableFile: missing, not a regular file (a folder, FIFO, socket or device; a link with
            ``follow_links=False``), larger than ``limit`` bytes (before reading, or grown while read), or a read
            error.
    """
    fd = _open(path, limit, what, follow_links)
    chunks, left = [], limit + 1
    try:
        while left > 0:
            chunk = os.read(fd, min(left, MiB))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    except OSError as e:
        raise unreadable(path, f"cannot be read ({e.strerror})") from None
    finally:
        os.close(fd)
    if left <= 0:
        raise unreadable(path, f"grew over the {_size(limit)} limit for {what} while it was read")
    return b"".join(chunks)


def read_text(path: str | Path, limit: int, what: str = "this file", follow_links: bool = True) -> str:
    """:func:`read_bytes` decoded as UTF-8 (strictly), at most ``limit`` bytes.

    Raises:
        UnreadableFile: as :func:`read_bytes`, or the bytes are not UTF-8 (naming the first bad byte's offset).
    """
    data = read_bytes(path, limit, what, follow_links)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise unreadable(path, f"is not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start:,})") from None


def read_tail(path: str | Path, limit: int, what: str = "this file", follow_links: bool = False) -> str:
    """The last ``limit`` bytes (at most) of the regular file ``path`` as text, undecodable bytes replaced: the
    end of a log, however long the log. A symbolic link is refused unless ``follow_links``.

    Raises:
        UnreadableFile: missing, not a regular file, a link (see above), or a read error.
    """
    fd = _open(path, None, what, follow_links)
    try:
        os.lseek(fd, max(os.fstat(fd).st_size - limit, 0), os.SEEK_SET)
        data = os.read(fd, limit)
    except OSError as e:
        raise unreadable(path, f"cannot be read ({e.strerror})") from None
    finally:
        os.close(fd)
    return data.decode("utf-8", errors="replace")


def _finite_float(text: str) -> float | None:
    value = float(text)
    return value if math.isfinite(value) else None


def _json_depth(data: Any) -> int:
    """How many arrays/objects nest in ``data`` (0 for a scalar); stops counting past :data:`MAX_DEPTH`."""
    deepest, stack = 0, [(data, 1)] if isinstance(data, dict | list) else []
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        if depth > MAX_DEPTH:
            break
        children = node.values() if isinstance(node, dict) else node
        stack.extend((c, depth + 1) for c in children if isinstance(c, dict | list))
    return deepest


def read_json(path: str | Path, limit: int = JSON_BYTES, what: str = "a JSON file", follow_links: bool = True) -> Any:
    """The JSON document in ``path`` (at most ``limit`` bytes, default :data:`JSON_BYTES`, 16 MiB), its non-finite
    numbers (``NaN``, ``Infinity``, ``-Infinity``, a float too large such as ``1e999``) read as ``None``.

    Raises:
        UnreadableFile: as :func:`read_text`; not valid JSON (line and column); nested deeper than
            :data:`MAX_DEPTH` arrays/objects.
    """
    text = read_text(path, limit, what, follow_links)
    try:
        data = json.loads(text, parse_float=_finite_float, parse_constant=lambda name: None)
    except RecursionError:
        raise unreadable(path, f"nests more than {MAX_DEPTH} arrays/objects deep, the limit for {what}") from None
    except json.JSONDecodeError as e:
        raise unreadable(path, f"is not valid JSON: {e.msg} at line {e.lineno}, column {e.colno}") from None
    except ValueError as e:  # an integer of more digits than Python converts (sys.get_int_max_str_digits)
        raise unreadable(path, f"is not valid JSON: {e}") from None
    if _json_depth(data) > MAX_DEPTH:
        raise unreadable(path, f"nests more than {MAX_DEPTH} arrays/objects deep, the limit for {what}")
    return data


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [child for pair in node.value for child in pair]
    return []


def yaml_tree_problem(root: yaml.Node, max_nodes: int = YAML_NODES, max_depth: int = MAX_DEPTH) -> str | None:
    """What is wrong with a composed YAML document as a tree, or ``None``: more than ``max_nodes`` nodes once
    its aliases are expanded, more than ``max_depth`` sequences/mappings inside one another, or an alias inside its
    own anchor (a document of infinite size). Each node of the graph is visited once (sizes memoised on node
    identity, no recursion): O(nodes + edges) however large the expanded tree would be."""
    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    pending: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if children_done:
            children = _children(node)
            size[key] = 1 + sum(size[id(c)] for c in children)
            depth[key] = (
                0 if isinstance(node, yaml.ScalarNode) else 1 + max((depth[id(c)] for c in children), default=0)
            )
            pending.discard(key)
            if size[key] > max_nodes:
                return f"expands to more than {max_nodes:,} nodes through its aliases (an alias bomb)"
            if depth[key] > max_depth:
                return f"nests deeper than {max_depth} sequences/mappings"
        elif key in size:
            continue
        elif key in pending:
            return "holds an alias inside its own anchor (a document of infinite size)"
        else:
            pending.add(key)
            stack.append((node, True))
            stack.extend((c, False) for c in _children(node) if id(c) not in size)
    return None


def read_yaml(path: str | Path, limit: int = YAML_BYTES, what: str = "a YAML config", follow_links: bool = True) -> Any:
    """The YAML document in ``path`` (at most ``limit`` bytes, default :data:`YAML_BYTES`, 4 MiB), read with the
    safe loader (plain data: no tag builds an object) and bounded as a tree (:func:`yaml_tree_problem`:
    :data:`YAML_NODES` nodes with aliases expanded, :data:`MAX_DEPTH` levels) before anything is built from it.
    ``None`` for an empty document.

    Raises:
        UnreadableFile: as :func:`read_text`; not valid YAML (line and column, as :func:`project.errors.yaml_problem`
            words it); more than one document; too large or too deep as a tree.
    """
    text = read_text(path, limit, what, follow_links)
    loader = SAFE_LOADER(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        problem = yaml_tree_problem(node)
        if problem is None:
            return loader.construct_document(node)
    except yaml.YAMLError as e:
        raise UnreadableFile(printable(yaml_problem(path, e))) from None
    except RecursionError:  # the pure-Python loader, on a document libyaml would refuse at 1,000 levels
        problem = f"nests deeper than {MAX_DEPTH} sequences/mappings"
    except (ValueError, TypeError, OverflowError) as e:  # a scalar its tag cannot build (2024-13-45)
        problem = f"is not valid YAML: {' '.join(str(e).split())}"
    finally:
        loader.dispose()
    raise unreadable(path, problem or "is not valid YAML")


def read_csv_rows(
    path: str | Path, limit: int = CSV_BYTES, what: str = "a CSV file", follow_links: bool = True
) -> list[dict]:
    """The rows of the CSV file ``path`` (at most ``limit`` bytes, default :data:`CSV_BYTES`, 16 MiB) as
    ``csv.DictReader`` gives them: ``{column: cell}``, the header naming the columns (cells beyond it under
    ``None``).

    Raises:
        UnreadableFile: as :func:`read_text`; a cell over the ``csv`` module's ``field_size_limit`` (128 KiB) or
            another CSV error.
    """
    text = read_text(path, limit, what, follow_links)
    try:
        return list(csv.DictReader(io.StringIO(text)))
    except csv.Error as e:
        raise unreadable(path, f"is not valid CSV: {e}") from None
