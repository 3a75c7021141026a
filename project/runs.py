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
from pathlib import Path
from typing import Any

import yaml

from project.checkpoints import check_zip_records, load_checkpoint  # noqa: F401  (run-folder readers use them as runs.*)
from project.errors import ConfigError
from project.files import (  # noqa: F401  (the run folder's writers: runs.write_text, ...)
    atomic_file,
    check_folder,
    check_no_links,
    inside,
    write_bytes,
    write_json,
    write_text,
)

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

    ``results.json``'s ``best_ckpt`` is data: only its file name is used, and only when it names a regular file
    directly in this run's ``checkpoints/`` (a copied or moved run uses its own checkpoint, never the original's
    nor any other path the file names).

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
        named = folder / Path(best).name if isinstance(best, str) and best else None
        if named is not None and inside(folder, named) and named.is_file():
            return named
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
    picked, and refused by the resume checks with what differs). Classes are compared by name: a run saved before
    a class moved to another module (``project.callbacks.Pruning`` -> ``project.callbacks.pruning.Pruning``) is
    the same kind."""
    trainer = config.get("trainer") if isinstance(config, dict) else None
    callbacks = (trainer.get("callbacks") if isinstance(trainer, dict) else None) or []
    callbacks = callbacks if isinstance(callbacks, list) else [callbacks]
    paths = (str(c.get("class_path")) if isinstance(c, dict) else str(c) for c in callbacks)
    return {"callbacks": sorted(path.rpartition(".")[2] for path in paths)}


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


def resume_configs(run: Path) -> list[tuple[int, Path]]:
    """The run's ``config-resume-<k>.yaml`` files as ``(k, path)``, oldest first; other names (a user's backup such
    as ``config-resume-old.yaml``) are not configs of the run."""
    numbered = (re.fullmatch(r"config-resume-(\d+)\.yaml", p.name) for p in run.glob("config-resume-*.yaml"))
    return sorted((int(m.group(1)), run / m.group(0)) for m in numbered if m)


def latest_config(run: Path) -> Path:
    """The config the run last ran with: its newest ``config-resume-<k>.yaml``, else ``config.yaml``."""
    resumes = resume_configs(run)
    return resumes[-1][1] if resumes else run / "config.yaml"


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
