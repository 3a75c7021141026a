"""The run folder: the one place that knows its layout.

``<save_dir>/<name>/version_N/`` holds one run and its resumes::

    config.yaml                  the config the run started with (never rewritten)
    config-resume-<k>.yaml       the config of each resume into this folder
    events.out.tfevents.*        TensorBoard: curves, layout, images, PR curves, graph
    hparams/events.out.tfevents.*  the run's HPARAMS session and metric columns (project.report.log_hparams)
    checkpoints/last.ckpt, checkpoints/epochNN-val_acc*.ckpt
    checkpoints/hpc_ckpt_<k>.ckpt  Lightning's SLURM preemption checkpoint (see project.cluster)
    slurm_job.json               the SLURM job that runs this folder, one entry per (re)start
    results.json                 written once the run has finished (atomically)
    metrics.csv                  one row per finished epoch (project.report.EpochMetrics), rewritten atomically

A new run's folder is **claimed** by :func:`claim_run` with an exclusive ``mkdir`` before the Trainer is built
(rank 0 only); Lightning's logger and checkpoint callback then write into that folder. Any number of processes,
on one machine or on shared storage whose ``mkdir`` is atomic (local disks, NFS, Lustre, GPFS), get one folder
each; a folder that holds a run (its ``config.yaml``) is never taken as a fresh run.

Everything the product writes into a run folder goes through :func:`write_bytes` (a new temporary file created
exclusively in the same folder, fsync, atomic rename): a file is either its old or its new content, never
half-written, and a link planted at a file's or a temporary file's name is replaced, never followed. A run
folder holding a symbolic link is refused for writing (:func:`check_no_links`).

Checkpoints are read with PyTorch's safe unpickler (``torch.load(weights_only=True)``): a file that
needs more (a pickle that could run code) is refused unless the caller trusts it explicitly. Paths stored
inside a checkpoint are data: :func:`inside` decides whether one may be touched (see ``RunCheckpoint``).
"""

from __future__ import annotations

import contextlib
import csv
import errno
import io
import json
import os
import re
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from project.errors import ConfigError

RESULTS = "results.json"
_VERSION = re.compile(r"version_(\d+)")


def to_builtin(hparams: Any) -> None:
    """Turn jsonargparse's typed numbers (``PositiveInt``, ...) in saved hyper-parameters into plain
    ``int``/``float`` in place, so checkpoints load with PyTorch's safe unpickler."""
    for key, value in list(hparams.items()):
        if isinstance(value, int | float) and not isinstance(value, bool) and type(value) not in (int, float):
            hparams[key] = int(value) if isinstance(value, int) else float(value)


def version_of(path: Path) -> int | None:
    m = _VERSION.fullmatch(path.name)
    return int(m.group(1)) if m else None


def runs_of(experiment: Path) -> list[Path]:
    """Run folders ``version_N`` of an experiment folder, oldest first (by N)."""
    if not experiment.is_dir():
        return []
    found = [p for p in experiment.iterdir() if p.is_dir() and version_of(p) is not None]
    return sorted(found, key=version_of)


def run_of_checkpoint(ckpt: Path) -> Path | None:
    """The run folder a checkpoint lies in (``<run>/checkpoints/<file>.ckpt``), or ``None``."""
    ckpt = ckpt.resolve()
    run = ckpt.parent.parent
    if ckpt.parent.name == "checkpoints" and version_of(run) is not None:
        return run
    return None


def checkpoint_of(run: Path, which: str = "last") -> Path:
    """``last.ckpt`` or the best checkpoint (by the run's ``results.json``, else the newest non-last file).

    Raises:
        ConfigError: the run holds no such checkpoint.
    """
    folder = run / "checkpoints"
    if which == "last":
        path = folder / "last.ckpt"
        if path.is_file():
            return path
    else:
        best = read_results(run).get("best_ckpt") if (run / RESULTS).is_file() else None
        if best and Path(best).is_file():
            return Path(best)
        candidates = sorted(
            (p for p in folder.glob("*.ckpt") if p.name != "last.ckpt" and not p.name.startswith("hpc_ckpt_")),
            key=os.path.getmtime,
        )
        if candidates:
            return candidates[-1]
    raise ConfigError(f"{run} holds no {which} checkpoint (looked in {folder})")


CONFIG = "config.yaml"
# Run folders this process claimed and may still release (empty) when the command fails before using them.
_claimed: list[Path] = []


def holds_run(run: Path) -> bool:
    """Whether ``run`` already holds a run (its ``config.yaml``, written when training starts)."""
    return (run / CONFIG).exists() or (run / CONFIG).is_symlink()


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


def claim_run(experiment: str | Path, version: int | str | None = None) -> Path:
    """Create and return a new run folder ``experiment/version_N``, atomically.

    ``N`` is one more than the highest version present (or ``version`` when given: an int names ``version_N``, a
    string the folder itself, as Lightning's loggers take it). The folder is made with
    ``os.mkdir``, which fails when the name exists: two processes never get the same folder, whatever the
    timing; a loser moves on to the next number. With an explicit ``version``, a folder that exists and holds
    a run is refused; an existing folder without a run (a sweep trial's folder, prepared by the sweep) is taken.

    Raises:
        ConfigError: the experiment folder cannot be created or written (naming it), or ``version`` holds a run.
    """
    experiment = Path(experiment)
    missing = [experiment, *experiment.parents]
    missing = missing[: next(i for i, p in enumerate(missing) if p.exists())] if experiment.parents else []
    check_folder(experiment, "trainer.logger.init_args.save_dir", keep=True)
    try:
        experiment.mkdir(parents=True, exist_ok=True)
        _claimed.extend(reversed(missing))  # released (when empty) after the run folder, deepest first
    except OSError as e:
        raise ConfigError(f"trainer.logger.init_args.save_dir: cannot create {experiment} ({e.strerror})") from None
    if version is not None:
        name = f"version_{version}" if isinstance(version, int) else str(version)
        if not name or Path(name).name != name or name in (".", ".."):
            raise ConfigError(f"trainer.logger.init_args.version: {version!r} is not a folder name; give N or a name")
        run = experiment / name
        try:
            run.mkdir()
        except FileExistsError:
            if run.is_symlink() or not run.is_dir() or holds_run(run):
                raise ConfigError(
                    f"trainer.logger.init_args.version: {run} already holds a run; continue it with --ckpt_path "
                    f"{run}, or leave the version unset for a new folder"
                ) from None
            check_no_links(run)
            return run
        except OSError as e:
            raise ConfigError(f"trainer.logger.init_args.version: cannot create {run} ({e.strerror})") from None
        _claimed.append(run)
        return run
    taken = [version_of(p) for p in experiment.iterdir()] if experiment.is_dir() else []
    n = max((v for v in taken if v is not None), default=-1) + 1
    for _ in range(10_000):
        run = experiment / f"version_{n}"
        try:
            run.mkdir()
        except FileExistsError:
            n += 1
            continue
        except FileNotFoundError:  # another process's failed start removed the (then empty) experiment folder
            experiment.mkdir(parents=True, exist_ok=True)
            continue
        except OSError as e:
            if e.errno == errno.ENOSPC:
                raise ConfigError(f"trainer.logger.init_args.save_dir: {experiment}: the disk is full") from None
            raise ConfigError(f"trainer.logger.init_args.save_dir: cannot create {run} ({e.strerror})") from None
        _claimed.append(run)
        return run
    raise ConfigError(f"trainer.logger.init_args.save_dir: no free version_N under {experiment}")


def release_claimed() -> None:
    """Remove the run folders this process claimed that are still empty (the command failed before using
    them), and the parent folders it created for them. A folder with anything in it is kept; nothing is
    removed recursively."""
    while _claimed:
        with contextlib.suppress(OSError):
            _claimed.pop().rmdir()


def forget_claimed() -> None:
    """The claimed folders are in use now (training started): :func:`release_claimed` leaves them alone."""
    _claimed.clear()


def check_no_links(run: Path) -> None:
    """Refuse a run folder to write into when it (or its ``checkpoints/``) holds a symbolic link.

    Lightning's logger and checkpoint callback open some files by name (``hparams.yaml``, event files,
    checkpoints through fsspec): a planted link would lead those writes outside the run.

    Raises:
        ConfigError: naming the link.
    """
    for folder in (run, run / "checkpoints"):
        if folder.is_symlink():
            raise ConfigError(f"{folder} is a symbolic link; a run folder is written only in place: replace it")
        if not folder.is_dir():
            continue
        for entry in folder.iterdir():
            if entry.is_symlink():
                raise ConfigError(
                    f"{entry} is a symbolic link; files of a run folder are never written through links: remove it"
                )


def inside(folder: str | Path, path: Any) -> bool:
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


def _logger_dir(logger: Any) -> Path | None:
    """``save_dir/name`` of a TensorBoardLogger config (a jsonargparse Namespace or dict), else ``None``."""
    if logger is None or logger is False or "TensorBoardLogger" not in str(getattr(logger, "class_path", "")):
        return None
    args = logger.init_args
    return Path(args.save_dir, args.name or "")


def kind_of(config: Any) -> dict[str, Any]:
    """What overlays change about a run of one experiment folder: its callbacks (pruning, structured pruning,
    ...) by class. Overlays such as ``configs/pruning.yaml`` keep the experiment's folder name, so
    ``--ckpt_path last`` compares this to pick the command's own runs (a run with another net or data is still
    picked, and refused by the resume checks with what differs)."""
    trainer = config.get("trainer") if isinstance(config, dict) else None
    callbacks = (trainer.get("callbacks") if isinstance(trainer, dict) else None) or []
    callbacks = callbacks if isinstance(callbacks, list) else [callbacks]
    return {"callbacks": sorted(str(c.get("class_path")) if isinstance(c, dict) else str(c) for c in callbacks)}


def _run_kind(run: Path) -> dict[str, Any] | None:
    try:
        config = yaml.safe_load(latest_config(run).read_text())
    except (OSError, yaml.YAMLError):
        return None
    return kind_of(config) if isinstance(config, dict) else None


def resolve_ckpt_path(spec: str, logger: Any, config: Any = None) -> Path:
    """Turn ``--ckpt_path`` into a checkpoint file.

    ``last`` / ``best``: that checkpoint of the newest run of this experiment (``save_dir/name``) of the
    command's own kind (:func:`kind_of` of ``config``, a plain dict: the same callback classes), so a pruning
    run beside plain runs is picked only by a command with the pruning overlay; a run
    folder: its ``last.ckpt``; a file: itself. Lightning's own ``"last"`` looks only in the new, empty run
    folder.

    Raises:
        ConfigError: nothing to resume from, naming where it looked.
    """
    if spec in ("last", "best"):
        experiment = _logger_dir(logger)
        if experiment is None:
            raise ConfigError(f"ckpt_path: {spec!r} needs a TensorBoardLogger to find the experiment's runs")
        found = [r for r in runs_of(experiment) if (r / "checkpoints").is_dir()]
        if not found:
            raise ConfigError(f"ckpt_path: {spec!r}: no run with checkpoints under {experiment}; train one first")
        if config is not None:
            kind = kind_of(config)
            mine = [r for r in found if _run_kind(r) == kind]
            if not mine:
                raise ConfigError(
                    f"ckpt_path: {spec!r}: no run under {experiment} was trained with this command's callbacks "
                    f"({', '.join(kind['callbacks']) or 'none'}); the newest, {found[-1].name}, had "
                    f"{', '.join((_run_kind(found[-1]) or {}).get('callbacks') or []) or 'none'}: give its folder to "
                    "--ckpt_path with its own configs"
                )
            found = mine
        return checkpoint_of(found[-1], spec)
    path = Path(spec)
    if path.is_dir():
        return checkpoint_of(path, "last")
    if not path.is_file():
        raise ConfigError(f"ckpt_path: {spec} does not exist; give a .ckpt file, a run folder, or 'last' / 'best'")
    return path


def load_checkpoint(path: str | Path, trust: bool = False) -> dict[str, Any]:
    """Read a checkpoint with ``torch.load(weights_only=True)`` on the CPU.

    Args:
        trust: allow full unpickling (``weights_only=False``) -- only for files the user made: a crafted
            pickle runs code when loaded.

    Untrusted files must be in PyTorch's zip format (what ``torch.save`` writes) with every record stored
    uncompressed, as ``torch.save`` stores them, and records no larger than the file: PyTorch allocates a
    record's declared uncompressed size before checking it, so a 400 KiB file with a deflated 400 MiB record
    took 400 MiB. The memory a checkpoint takes is then bounded by its file size.

    Raises:
        ConfigError: unreadable, not a Lightning checkpoint, or (untrusted) needing more than the safe
            unpickler allows, or with records compressed or larger than the file.
    """
    import torch  # here: the commands that only read run folders (summarize) need not import torch

    if not trust:
        check_zip_records(path)
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=not trust)
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
    if not isinstance(ckpt, dict) or "state_dict" not in ckpt or "loops" not in ckpt:
        raise ConfigError(f"ckpt_path: {path} is not a Lightning training checkpoint (no state_dict/loops)")
    return ckpt


def check_zip_records(path: str | Path) -> None:
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


def resume_in_place(ckpt: Path, logger: Any) -> None:
    """Point the logger at the run folder the checkpoint came from, so the run continues there.

    Lightning would start a new ``version_N+1``; ModelCheckpoint would then forget the best score so far and
    the curves would split over two folders. Only done when the checkpoint belongs to this experiment and no
    logger version was set explicitly.
    """
    experiment = _logger_dir(logger)
    run = run_of_checkpoint(ckpt)
    if experiment is None or run is None or logger.init_args.version is not None:
        return
    if run.parent == experiment.resolve():
        logger.init_args.version = version_of(run)


def latest_config(run: Path) -> Path:
    """The config the run last ran with: its newest ``config-resume-<k>.yaml``, else ``config.yaml``."""
    resumes = sorted(run.glob("config-resume-*.yaml"), key=lambda p: int(re.findall(r"\d+", p.stem)[-1]))
    return resumes[-1] if resumes else run / "config.yaml"


def read_results(run: Path) -> dict[str, Any]:
    """The run's ``results.json`` as a dict.

    Raises:
        ConfigError: the run has no readable ``results.json`` (it has not finished).
    """
    path = run / RESULTS
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path} is missing or unreadable ({type(e).__name__}); has the run finished?") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} is not a results object")
    return data


@contextlib.contextmanager
def atomic_file(path: str | Path) -> Iterator[Any]:
    """A binary file object whose content replaces ``path`` atomically, never through a link, when the block ends.

    The bytes go to a new temporary file that :func:`tempfile.mkstemp` creates exclusively (``O_EXCL``: a link
    or file planted under any name is never opened) in the same folder, are flushed to disk, and the file is
    renamed over ``path`` (``os.replace``, which replaces a link at ``path`` rather than following it). A reader
    sees the old or the new file, never a half-written one, even when the process is killed midway. An error in
    the block removes the temporary file and leaves ``path`` as it was.

    Raises:
        OSError: the folder is missing or unwritable, or the disk is full (the temporary file is removed).
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide results from the rest of a team sharing logs/
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_bytes(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` through :func:`atomic_file`; returns ``path``."""
    with atomic_file(path) as f:
        f.write(data)
    return Path(path)


def write_text(path: str | Path, text: str) -> Path:
    """:func:`write_bytes` of ``text`` in UTF-8."""
    return write_bytes(path, text.encode())


def write_json(path: Path, data: dict[str, Any]) -> Path:
    """Write ``data`` as JSON atomically, never through a link (:func:`write_bytes`); returns ``path``."""
    return write_text(path, json.dumps(data, indent=2) + "\n")




def write_report(out: Path, data: dict[str, Any], table: str) -> None:
    """Write ``data`` to ``out`` (JSON) and ``table`` beside it (``out`` with ``.md``), creating the folder;
    print the table and where both went. The benches' output."""
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json(out, data)
    write_text(out.with_suffix(".md"), table)
    print(table)
    print(f"wrote {out} and {out.with_suffix('.md')}")


def write_results(run: Path, results: dict[str, Any]) -> Path:
    """Write the run's ``results.json`` atomically; returns its path."""
    return write_json(run / RESULTS, results)


def find_run(spec: str | Path) -> Path:
    """The run folder meant by ``spec``: a run folder, an experiment folder (its newest run), or a checkpoint.

    Raises:
        ConfigError: nothing that holds a run's ``config.yaml``.
    """
    path = Path(spec)
    if path.is_file() and path.suffix == ".ckpt":
        run = run_of_checkpoint(path)
        if run is not None:
            return run
    if path.is_dir() and (path / "config.yaml").is_file():
        return path
    if path.is_dir():
        found = [r for r in runs_of(path) if (r / "config.yaml").is_file()]
        if found:
            return found[-1]
    raise ConfigError(
        f"{spec} is not a run folder (logs/<experiment>/version_N with a config.yaml), an experiment folder or a "
        "checkpoint inside a run"
    )


def checkpoint_arg(run: Path, which: str) -> Path:
    """``best`` / ``last`` of ``run``, or a checkpoint file path.

    Raises:
        ConfigError: no such checkpoint.
    """
    if which in ("best", "last"):
        return checkpoint_of(run, which)
    path = Path(which)
    if not path.is_file():
        raise ConfigError(f"--ckpt: {which} is neither best, last nor a checkpoint file")
    return path


def command_checkpoint(spec: str, which: str) -> tuple[Path, Path, str]:
    """What a run-folder command's ``RUN`` argument and ``--ckpt`` name: ``(run, checkpoint file, name)``.

    ``spec`` is a run folder, an experiment folder (its newest run) or a checkpoint file inside a run (which then
    wins over ``which``); ``name`` is ``best``/``last`` or the file's stem, for the files the command writes.

    Raises:
        ConfigError: no such run or checkpoint.
    """
    run = find_run(spec)
    if Path(spec).suffix == ".ckpt":
        return run, Path(spec), Path(spec).stem
    ckpt = checkpoint_arg(run, which)
    return run, ckpt, which if which in ("best", "last") else ckpt.stem


def snapshot(run: Path | None) -> dict[Path, float]:
    """Every file under ``run`` with its modification time (empty when the folder does not exist)."""
    if run is None or not run.exists():
        return {}
    return {p: p.stat().st_mtime for p in run.rglob("*") if p.is_file()}


def undo_since(run: Path, before: dict[Path, float]) -> bool:
    """Remove what a failed command added to ``run``, unless it wrote a checkpoint worth keeping.

    A new folder with no checkpoint is removed whole; in an existing folder (a resume), the files the
    command created are removed. Returns whether anything was undone.
    """
    if not run.exists():
        return False
    now = snapshot(run)
    new_ckpts = [p for p, t in now.items() if p.suffix == ".ckpt" and before.get(p) != t]
    if new_ckpts:
        return False
    if not before:
        import shutil

        shutil.rmtree(run, ignore_errors=True)
        return True
    for p in now:
        if p not in before:
            p.unlink(missing_ok=True)
    return True


METRICS_CSV = "metrics.csv"


def read_epoch_metrics(run: Path | None) -> list[dict[str, float]]:
    """The rows of a run's ``metrics.csv`` (see :class:`project.report.EpochMetrics`): ``{"epoch": int, "step":
    int, metric: float}``, empty cells left out; ``[]`` when the run has none or it is unreadable. Read as data: a
    malformed cell is skipped, a file over 16 MiB is not read."""
    path = run / METRICS_CSV if run is not None else None
    try:
        if path is None or path.stat().st_size > 16 << 20:
            return []
        text = path.read_text()
    except (OSError, UnicodeDecodeError):
        return []
    rows = []
    for raw in csv.DictReader(io.StringIO(text)):
        row: dict[str, float] = {}
        for key, cell in raw.items():
            try:
                row[key] = float(cell)
            except (TypeError, ValueError):
                continue
        if "epoch" in row and "step" in row:
            row["epoch"], row["step"] = int(row["epoch"]), int(row["step"])
            rows.append(row)
    return rows
