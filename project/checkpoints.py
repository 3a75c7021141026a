"""Reading checkpoint files, which come from elsewhere: PyTorch's safe unpickler, sizes checked before reading.

A checkpoint is read with ``torch.load(weights_only=True)``: a file that needs more (a pickle that could run code)
is refused unless the caller trusts it explicitly; its zip records are checked against the file first.
"""

from __future__ import annotations

import os
import re
import zipfile
from pathlib import Path
from typing import Any

from project.errors import ConfigError


def load_checkpoint(path: str | Path, trust: bool = False) -> dict[str, Any]:
    """A Lightning training checkpoint (``state_dict`` and ``loops``), read by :func:`read_checkpoint`.

    Raises:
        ConfigError: as :func:`read_checkpoint`, or not a Lightning training checkpoint.
    """
    ckpt = read_checkpoint(path, trust)
    if not isinstance(ckpt, dict) or "state_dict" not in ckpt or "loops" not in ckpt:
        raise ConfigError(f"ckpt_path: {path} is not a Lightning training checkpoint (no state_dict/loops)")
    return ckpt


def read_checkpoint(path: str | os.PathLike[str], trust: bool = False) -> Any:
    """Read a checkpoint file with ``torch.load(weights_only=True)`` on the CPU.

    Args:
        trust: allow full unpickling (``weights_only=False``) -- only for files the user made: a crafted
            pickle runs code when loaded.

    Untrusted files must be in PyTorch's zip format (what ``torch.save`` writes) with every record stored
    uncompressed, as ``torch.save`` stores them, and records no larger than the file: PyTorch allocates a
    record's declared uncompressed size before checking it, so a small file with a deflated record can claim
    any amount of memory. The memory a checkpoint takes is then bounded by its file size.

    Raises:
        ConfigError: unreadable, or (untrusted) needing more than the safe unpickler allows, or with records
            compressed or larger than the file.
    """
    import torch  # here: the commands that only read run folders (summarize) need not import torch

    if not trust:
        check_zip_records(path)
    try:
        # bandit B614: safe unless trusted
        ckpt = torch.load(path, map_location="cpu", weights_only=not trust)  # nosec B614
    except Exception as e:
        unsafe = re.search(r"(Unsupported (global|class)|unsupported GLOBAL)[^\n]*", str(e))
        if unsafe and not trust:
            raise ConfigError(
                f"ckpt_path: {path} needs more than PyTorch's safe unpickler ({unsafe.group(0).strip()}); "
                "it may be unsafe: a crafted checkpoint runs code when loaded. Load it only if you made it: "
                "--trust_checkpoint true"
            ) from None
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise ConfigError(f"ckpt_path: {path} is not a readable checkpoint ({type(e).__name__}: {first})") from None
    return ckpt


def check_zip_records(path: str | os.PathLike[str]) -> None:
    """Refuse a checkpoint that is not a zip of stored records whose sizes fit in the file (see ``load_checkpoint``).

    Raises:
        ConfigError: naming the file and the problem.
    """
    try:
        size = os.path.getsize(path)
        with zipfile.ZipFile(path) as archive:
            records = archive.infolist()
    except (OSError, zipfile.BadZipFile) as e:
        raise ConfigError(
            f"ckpt_path: {path} is not a readable checkpoint in PyTorch's zip format ({type(e).__name__}: {e})"
        ) from None
    packed = [r.filename for r in records if r.compress_type != zipfile.ZIP_STORED]
    declared = sum(r.file_size for r in records)
    if packed or declared > size:
        why = f"record {packed[0]} is compressed" if packed else f"its records declare {declared} bytes"
        raise ConfigError(
            f"ckpt_path: {path} is not a checkpoint as torch.save writes it ({why}, in a file of {size} bytes); "
            "refused before reading it"
        )
