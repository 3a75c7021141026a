"""What every ``python -m project.<command>`` does around its work: one ``error:`` line and an exit status for every
user-caused failure, logging set up once, and Python's exit without its slow final garbage collection.

* :func:`run_main` -- turns jsonargparse's errors, the project's (:class:`~project.errors.UserError`) and
  Lightning's ``MisconfigurationException`` into one ``error:`` line and an exit status;
* :func:`explain_parse_error` -- jsonargparse's multi-line type error as one line naming the key;
* :func:`exit_with` -- ``sys.exit`` for a command's process (see its docstring).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import signal
import sys
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

from jsonargparse import ArgumentError
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch.utilities.exceptions import SIGTERMException

from project.cli.parse_errors import explain_parse_error
from project.errors import ConfigError, UserError


def setup_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s: %(message)s")
    # Lightning advertises a cloud logger on every start; this project logs to TensorBoard.
    logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(lambda r: "litlogger" not in r.getMessage())


# The loggers of the banner Lightning prints while it sets up a run ("Seed set to 42", "GPU available: ...",
# "TPU available: ...", "Using bfloat16 Automatic Mixed Precision (AMP)", "LOCAL_RANK: 0 - CUDA_VISIBLE_DEVICES",
# "💡 Tip: ..."): all are INFO records of these two hierarchies; Lightning's warnings go through `warnings`.
BANNER_LOGGERS = ("lightning.pytorch", "lightning.fabric")


@contextlib.contextmanager
def quiet_library_banners() -> Iterator[None]:
    """Lightning's set-up banner off while a command that only reads a run (evaluate, predict, export) works.

    Raises the level of :data:`BANNER_LOGGERS` to WARNING for the whole command (the banner comes again when it
    calls ``Trainer.test``/``predict``, after the run is rebuilt) and restores the levels afterwards, so a
    program calling a command's ``main`` keeps its own logging. Lightning's warnings and errors, the command's own
    result line and its ``error:`` lines are untouched. ``fit`` keeps the banner: it says which device and
    precision the run trains on.
    """
    loggers = [logging.getLogger(name) for name in BANNER_LOGGERS]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.WARNING)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


SIGTERM_STATUS = 128 + signal.SIGTERM  # 143


def exit_with(main: Callable[[], int]) -> NoReturn:
    """``sys.exit(main())`` for the process of a ``python -m project.<command>``, without Python's slow exit.

    At exit Python collects garbage over every object still alive, which after importing torch, torchvision and
    Lightning is seconds of a short ``fit`` (docs/decisions.md). ``gc.freeze()`` (standard library) moves the
    objects alive at that moment (the imported modules, mostly) out of the collector's reach, here before and
    after the work, so the exit is quick and the collections during training find less to scan. Nothing
    is skipped: finalizers, ``atexit`` handlers and logger flushes still run.

    A run stopped by SIGTERM (:data:`SIGTERM_STATUS` from :func:`run_main`) ends by SIGTERM again, as a shell
    command does, so that SLURM, a container runtime or ``project.sweep`` sees a killed process, not a success.
    """
    gc.freeze()
    status = main()
    gc.freeze()
    if status == SIGTERM_STATUS:  # stopped by SIGTERM: end by it too, so that a parent (a scheduler) sees a kill
        sys.stdout.flush()
        sys.stderr.flush()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
    sys.exit(status)


def run_main(make_cli: Callable[[], Any], work: Callable[[Any], Any]) -> int:
    """Build the CLI, do the work; every user-caused failure becomes one ``error:`` line on stderr.

    Returns:
        0 on success, 2 for a bad config (parse errors, :class:`ConfigError`, Lightning's
        ``MisconfigurationException``), 1 for bad data or a failed run (:class:`UserError`),
        :data:`SIGTERM_STATUS` (143, as a shell reports a SIGTERM) when a SIGTERM stopped the run.
    """
    setup_logging()
    cli = None
    try:
        cli = make_cli()
        work(cli)
    except SIGTERMException:  # Lightning's loops raise it (a SystemExit without a code) after a SIGTERM
        print(
            "error: stopped by SIGTERM; a run folder that holds a checkpoint is kept: resume it with --ckpt_path "
            "last (or the folder)",
            file=sys.stderr,
        )
        return SIGTERM_STATUS
    except (ArgumentError, ValueError, MisconfigurationException, UserError) as e:
        shown = _cause(e)
        parsing = cli is None and shown is e
        status = _exit_status(shown, parsing)
        if status is None:
            raise
        if parsing and not isinstance(shown, MisconfigurationException):
            print(f"error: {explain_parse_error(shown)} (see --help)", file=sys.stderr)
        else:
            print(f"error: {_one_line(shown)}", file=sys.stderr)
        return status
    return 0


def _cause(e: BaseException) -> BaseException:
    """The project's own error behind ``e``, when jsonargparse wrapped it: a data module's constructor that refuses
    its folder raises a :class:`UserError`, which jsonargparse reports as "Does not validate against any of the
    Union subtypes" with the message buried in its list; the user gets the message itself."""
    return next((cause for cause in exception_chain(e) if isinstance(cause, UserError)), e)


def exception_chain(e: BaseException) -> Iterator[BaseException]:
    """``e``, then the exception it was raised from or during (``__cause__``, else ``__context__``), and so on, each
    once."""
    seen: set[int] = set()
    cause: BaseException | None = e
    while cause is not None and id(cause) not in seen:
        yield cause
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__


def _exit_status(e: BaseException, parsing: bool) -> int | None:
    """2 for a bad config, 1 for bad data or a failed run, None for a bug (re-raised with its traceback)."""
    if isinstance(e, (ArgumentError, ConfigError, MisconfigurationException)):
        return 2
    if isinstance(e, UserError):
        return 1
    # a plain ValueError: jsonargparse's type checks while parsing; Lightning's checks of settings while building
    # the Trainer (e.g. barebones with a logger) or while running
    bad_config = (parsing and _raised_by(e, "jsonargparse")) or _raised_by(e, "lightning")
    return 2 if bad_config else None


def _raised_by(e: BaseException, package: str) -> bool:
    """Whether ``package`` itself raised ``e``: Lightning's checks of Trainer settings against the data, and
    jsonargparse's type checks outside parsing proper (while classes are instantiated), raise a plain ValueError."""
    tb = e.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and f"{os.sep}{package}{os.sep}" in tb.tb_frame.f_code.co_filename


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())
