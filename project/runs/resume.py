"""``fit --ckpt_path``: which checkpoint a resume starts from, and the run folder it continues in.

:func:`resolve_ckpt_path` turns ``last``, ``best``, a run folder or a file into one checkpoint file (``last`` and
``best`` look in the newest run of the experiment of the command's own kind, :func:`kind_of`);
:func:`resume_in_place` points the logger at that checkpoint's run folder, so the resumed run continues there
instead of starting ``version_N+1``. Errors are :class:`~project.errors.ConfigError` naming where it looked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from project.errors import ConfigError, UnreadableFile
from project.runs.layout import (
    CHECKPOINTS,
    checkpoint_of,
    read_latest_config,
    run_of_checkpoint,
    runs_of,
    version_of,
)


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
    """:func:`kind_of` the run's latest config; ``None`` when it has none or it cannot be read (as data, bounded:
    :func:`project.runs.layout.read_latest_config`)."""
    try:
        config = read_latest_config(run)
    except UnreadableFile:
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
        found = [r for r in runs_of(experiment) if (r / CHECKPOINTS).is_dir()]
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
