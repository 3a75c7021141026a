"""New run folders, claimed atomically: an exclusive ``mkdir`` gives each process its own ``version_N``.

A folder that holds a run (its ``config.yaml``) is never taken as a fresh run. The folders a command claimed are
listed in the ``made`` list it passes (:class:`project.cli.parser.ProjectCLI` keeps one per command), so that
:func:`release` removes those still empty when the command fails before using them."""

from __future__ import annotations

import contextlib
import errno
from pathlib import Path

from project.errors import ConfigError
from project.runs.files import check_folder
from project.runs.layout import check_no_links, holds_run, version_of


def claim_run(experiment: str | Path, version: int | str | None = None, made: list[Path] | None = None) -> Path:
    """Create and return a new run folder ``experiment/version_N``, atomically.

    ``N`` is one more than the highest version present (or ``version`` when given: an int names ``version_N``, a
    string the folder itself, as Lightning's loggers take it). The folder is made with
    ``os.mkdir``, which fails when the name exists: two processes never get the same folder, whatever the
    timing; a loser moves on to the next number. With an explicit ``version``, a folder that exists and holds
    a run is refused; an existing folder without a run (a sweep trial's folder, prepared by the sweep) is taken.

    Raises:
        ConfigError: the experiment folder cannot be created or written (naming it), or ``version`` holds a run.

    ``made`` (when given) receives every folder created here, parents first, for :func:`release`.
    """
    made = [] if made is None else made
    experiment = Path(experiment)
    _make_experiment(experiment, made)
    if version is not None:
        return _claim_version(experiment, version, made)
    return _claim_next(experiment, made)


def _make_experiment(experiment: Path, made: list[Path]) -> None:
    """Create the experiment folder (and its missing parents, added to ``made`` parents first) after checking it
    can be written.

    Raises:
        ConfigError: it cannot be created or written (``trainer.logger.init_args.save_dir: ...``).
    """
    missing = [experiment, *experiment.parents]
    missing = missing[: next(i for i, p in enumerate(missing) if p.exists())] if experiment.parents else []
    check_folder(experiment, "trainer.logger.init_args.save_dir", keep=True)
    try:
        experiment.mkdir(parents=True, exist_ok=True)
        made.extend(reversed(missing))  # released (when empty) after the run folder, deepest first
    except OSError as e:
        raise ConfigError(f"trainer.logger.init_args.save_dir: cannot create {experiment} ({e.strerror})") from None


def _claim_version(experiment: Path, version: int | str, made: list[Path]) -> Path:
    """The run folder an explicit ``version`` names (``version_N`` for an int, else the string itself): created
    (and added to ``made``), or taken when it exists without a run.

    Raises:
        ConfigError: ``version`` is no folder name, the folder holds a run (or is a link or a file), holds a
            link, or cannot be created.
    """
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
    made.append(run)
    return run


def _claim_next(experiment: Path, made: list[Path]) -> Path:
    """The next free ``version_N`` (one above the highest present), created with an exclusive ``mkdir`` and added
    to ``made``; a name another process took first moves on to ``N + 1`` (at most 10,000 tries).

    Raises:
        ConfigError: the disk is full, the folder cannot be created, or no free ``version_N`` was found.
    """
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
        made.append(run)
        return run
    raise ConfigError(f"trainer.logger.init_args.save_dir: no free version_N under {experiment}")


def release(made: list[Path]) -> None:
    """Remove the folders in ``made`` (filled by :func:`claim_run`) that are still empty, newest first: the command
    failed before using them. A folder with anything in it is kept; nothing is removed recursively."""
    while made:
        with contextlib.suppress(OSError):
            made.pop().rmdir()
