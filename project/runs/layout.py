"""The run folder: the one place that knows its layout.

``<save_dir>/<name>/version_N/`` holds one run and its resumes::

    config.yaml                  the config the run started with (never rewritten)
    config-resume-<k>.yaml       the config of each resume into this folder
    events.out.tfevents.*        TensorBoard: curves, layout, images, PR curves, graph
    hparams/events.out.tfevents.*  the run's HPARAMS session and metric columns (project.report.results.log_hparams)
    checkpoints/last.ckpt, checkpoints/epochNN-val_acc*.ckpt
    checkpoints/hpc_ckpt_<k>.ckpt  Lightning's SLURM preemption checkpoint (see project.cluster)
    slurm_job.json               the SLURM job that runs this folder, one entry per (re)start
    results.json                 written once the run has finished (atomically)
    metrics.csv                  one row per finished epoch (project.report.EpochMetrics), rewritten atomically
    eval-<ckpt>-<split>.json     what ``python -m project.evaluate`` measured
    model-<ckpt>.<format>, export.json  ``python -m project.export``'s files and what it measured of them
    trial.json, sweep-trial.yaml, sweep-fit.log, pruned.json  a sweep trial's record, config, log and pruning

The names are the constants below (:data:`CONFIG`, :data:`CHECKPOINTS`, ...), the one place code spells them; the
best checkpoints' names follow the ``checkpoint.filename`` setting.

A new run's folder is **claimed** by :func:`claim_run` with an exclusive ``mkdir`` before the Trainer is built
(rank 0 only); Lightning's logger and checkpoint callback then write into that folder. Any number of processes,
on one machine or on shared storage whose ``mkdir`` is atomic (local disks, NFS, Lustre, GPFS), get one folder
each; a folder that holds a run (its ``config.yaml``) is never taken as a fresh run.

Everything the product writes into a run folder goes through :func:`write_bytes` (a new temporary file created
exclusively in the same folder, fsync, atomic rename): a file is either its old or its new content, never
half-written, and a link planted at a file's or a temporary file's name is replaced, never followed. A run
folder holding a symbolic link is refused for writing (:func:`check_no_links`).

Files of a run folder are read as data through :mod:`project.runs.read` (regular files only, sizes checked first,
bounded parsers): a copied or shared run folder may hold anything.

Checkpoints are read with PyTorch's safe unpickler (``torch.load(weights_only=True)``): a file that
needs more (a pickle that could run code) is refused unless the caller trusts it explicitly. Paths stored
inside a checkpoint are data: :func:`inside` decides whether one may be touched (see ``RunCheckpoint``).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from project.errors import ConfigError, UnreadableFile
from project.runs import files, read
from project.runs.files import inside, write_json

log = logging.getLogger("project")

# The names of a run folder's entries (the module docstring says what each holds). A name with ``{}`` fields is
# a pattern: ``CONFIG_RESUME.format(k)``, ``EVAL.format(ckpt=..., split=...)``.
CONFIG = "config.yaml"
CONFIG_RESUME = "config-resume-{}.yaml"
CHECKPOINTS = "checkpoints"
LAST_CKPT = "last.ckpt"
HPC_CKPT_PREFIX = "hpc_ckpt_"  # hpc_ckpt_<k>.ckpt, Lightning's name for its SLURM preemption checkpoints
RESULTS = "results.json"
METRICS_CSV = "metrics.csv"
HPARAMS = "hparams"
EVENTS_GLOB = "events.out.tfevents.*"
SLURM_JOB = "slurm_job.json"
EVAL = "eval-{ckpt}-{split}.json"
EXPORTED_MODEL = "model-{ckpt}{suffix}"
EXPORT = "export.json"
TRIAL = "trial.json"
TRIAL_CONFIG = "sweep-trial.yaml"
FIT_LOG = "sweep-fit.log"
PRUNED = "pruned.json"
# The config keys of the run callbacks (project.cli.parser.RUN_CALLBACKS) in a run's config.yaml: how a run is
# watched (speed, learning rate, layout, metrics.csv, SLURM requeue), not what it computes.
RUN_CALLBACK_KEYS = ("throughput", "lr_monitor", "tensorboard_layout", "metrics_csv", "slurm_requeue")


_VERSION = re.compile(r"version_(\d+)")


def version_of(path: Path) -> int | None:
    m = _VERSION.fullmatch(path.name)
    return int(m.group(1)) if m else None


def runs_of(experiment: Path) -> list[Path]:
    """Run folders ``version_N`` of an experiment folder, oldest first (by N)."""
    if not experiment.is_dir():
        return []
    found = [p for p in experiment.iterdir() if p.is_dir() and version_of(p) is not None]
    return sorted(found, key=lambda p: version_of(p) or 0)


def run_of_checkpoint(ckpt: Path) -> Path | None:
    """The run folder a checkpoint lies in (``<run>/checkpoints/<file>.ckpt``), or ``None``."""
    ckpt = ckpt.resolve()
    run = ckpt.parent.parent
    if ckpt.parent.name == CHECKPOINTS and version_of(run) is not None:
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
    folder = run / CHECKPOINTS
    if which == "last":
        path = folder / LAST_CKPT
        if path.is_file():
            return path
    else:
        best = read_results(run).get("best_ckpt") if (run / RESULTS).is_file() else None
        named = folder / Path(best).name if isinstance(best, str) and best else None
        if named is not None and inside(folder, named) and named.is_file():
            return named
        candidates = sorted(
            (p for p in folder.glob("*.ckpt") if p.name != LAST_CKPT and not p.name.startswith(HPC_CKPT_PREFIX)),
            key=os.path.getmtime,
        )
        if candidates:
            return candidates[-1]
    raise ConfigError(f"{run} holds no {which} checkpoint (looked in {folder})")


def holds_run(run: Path) -> bool:
    """Whether ``run`` already holds a run (its ``config.yaml``, written when training starts)."""
    return (run / CONFIG).exists() or (run / CONFIG).is_symlink()


def check_no_links(run: Path) -> None:
    """Refuse a run folder to write into when it (or its ``checkpoints/``) holds a symbolic link.

    Lightning's logger and checkpoint callback open some files by name (``hparams.yaml``, event files,
    checkpoints through fsspec): a planted link would lead those writes outside the run.

    Raises:
        ConfigError: naming the link.
    """
    for folder in (run, run / CHECKPOINTS):
        if folder.is_symlink():
            raise ConfigError(f"{folder} is a symbolic link; a run folder is written only in place: replace it")
        if not folder.is_dir():
            continue
        for entry in folder.iterdir():
            if entry.is_symlink():
                raise ConfigError(
                    f"{entry} is a symbolic link; files of a run folder are never written through links: remove it"
                )


def resume_configs(run: Path) -> list[tuple[int, Path]]:
    """The run's ``config-resume-<k>.yaml`` files as ``(k, path)``, oldest first; other names (a user's backup such
    as ``config-resume-old.yaml``) are not configs of the run."""
    pattern = re.escape(CONFIG_RESUME).replace(re.escape("{}"), r"(\d+)")
    numbered = (re.fullmatch(pattern, p.name) for p in run.glob(CONFIG_RESUME.format("*")))
    return sorted((int(m.group(1)), run / m.group(0)) for m in numbered if m)


def latest_config(run: Path) -> Path:
    """The config the run last ran with: its newest ``config-resume-<k>.yaml``, else ``config.yaml``."""
    resumes = resume_configs(run)
    return resumes[-1][1] if resumes else run / CONFIG


def read_latest_config(run: Path) -> Any:
    """The config the run last ran with (:func:`latest_config`) as data: :func:`project.runs.read.read_yaml` (the
    safe loader, at most 4 MiB, bounded as a tree); ``None`` when the run has no config or it is empty.

    Raises:
        UnreadableFile: the config is there but is no regular file, too large, not UTF-8 or not valid YAML.
    """
    path = latest_config(run)
    return read.read_yaml(path, what="a run's config") if os.path.lexists(path) else None


def read_results(run: Path) -> dict[str, Any]:
    """The run's ``results.json`` as a dict, read as data (:func:`project.runs.read.read_json`: at most 16 MiB,
    non-finite numbers as ``None``).

    Raises:
        UnreadableFile: ``results.json`` is there but is no regular file, too large, or not a JSON object.
        ConfigError: the run has no ``results.json`` (it has not finished).
    """
    path = run / RESULTS
    if not os.path.lexists(path):
        raise ConfigError(f"{path} is missing or unreadable (FileNotFoundError); has the run finished?")
    data = read.read_json(path, what=RESULTS)
    if not isinstance(data, dict):
        raise read.unreadable(path, "is not a results object (a JSON object)")
    return data


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
    root = files.held_root(run)
    if root is not None:  # nothing is removed through a link swapped in on the way (files.hold_below)
        try:
            os.close(files.open_below(root, run, create=False))
        except FileNotFoundError:
            return False
        except OSError as e:
            log.warning("%s: not cleaned up: %s", run, e)
            return False
    if not run.exists():
        return False
    now = snapshot(run)
    new_ckpts = [p for p, t in now.items() if p.suffix == ".ckpt" and before.get(p) != t]
    if new_ckpts:
        return False
    if not before:
        import shutil

        if root is None:
            shutil.rmtree(run, ignore_errors=True)
            return True
        parent = files.open_below(root, run.parent, create=False)
        try:  # the folder's own name in its parent's descriptor: no component followed on the way
            shutil.rmtree(run.name, ignore_errors=True, dir_fd=parent)
        finally:
            os.close(parent)
        return True
    for p in now:
        if p not in before:
            if root is not None:
                files.unlink_below(p, root)
            else:
                p.unlink(missing_ok=True)
    return True


@contextlib.contextmanager
def undone_on_failure(run: Path | None, owner: bool = True) -> Iterator[None]:
    """Whatever escapes the block (an error, Ctrl-C) first removes what the block added to ``run``
    (:func:`undo_since`), when this process ``owner``s the folder (global rank 0) and there is one."""
    before = snapshot(run)
    try:
        yield
    except BaseException:
        if owner and run is not None:
            undo_since(run, before)
        raise


def read_epoch_metrics(run: Path | None, strict: bool = False) -> list[dict[str, float]]:
    """The rows of a run's ``metrics.csv`` (see :class:`project.report.EpochMetrics`): ``{"epoch": int, "step":
    int, metric: float}``, empty cells left out; ``[]`` when the run has none. Read as data
    (:func:`project.runs.read.read_csv_rows`: at most 16 MiB, cells up to 128 KiB): a malformed cell is skipped, a
    row without a finite epoch and step too.

    Raises:
        UnreadableFile: with ``strict``, a ``metrics.csv`` that is there but cannot be read (without ``strict``:
            ``[]``).
    """
    if run is None:
        return []
    path = run / METRICS_CSV
    try:
        raw_rows = read.read_csv_rows(path, what=METRICS_CSV)
    except UnreadableFile:
        if strict and os.path.lexists(path):
            raise
        return []
    rows = []
    for raw in raw_rows:
        row: dict[str, float] = {}
        for key, cell in raw.items():
            try:
                row[key] = float(cell)
            except (TypeError, ValueError):
                continue
        if math.isfinite(row.get("epoch", math.nan)) and math.isfinite(row.get("step", math.nan)):
            row["epoch"], row["step"] = int(row["epoch"]), int(row["step"])
            rows.append(row)
    return rows
