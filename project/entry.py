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
import re
import signal
import sys
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

from jsonargparse import ArgumentError
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch.utilities.exceptions import SIGTERMException

from project.errors import ConfigError, UserError

_GENERIC = ("Expected a <class 'NoneType'>", "Not a valid subclass", "a class path", "a dict ")


def explain_parse_error(message: str) -> str:
    """Boil jsonargparse's multi-line type error down to one line: the key, the value, what was expected.

    A ``ConfigError`` raised while a class was instantiated (e.g. ``model.net: ...``) is passed through as is.
    """
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    restricted = re.search(r"Not of type (\w+): (.*?) does not conform to restriction (.*)", message)
    if restricted:
        keys = [k for k in re.findall(r'Parser key "([^"]+)"', message) if k != "init_args"]
        name, value, rule = restricted.groups()
        return f"{'.'.join(keys)}: {value} is not a {name} (needs {rule.strip()})"
    nested = re.search(
        r"- Problem with given class_path '[^']+':\s*Parser key \"([^\"]+)\":\s*Expected a (.*?)\. Got value: (.*)",
        message,
    )
    outer = re.match(r'Parser key "([^"]+)"', message.strip())
    if nested and outer:  # an init argument of a class given by class_path (e.g. a callback's): name the key
        key, expected, given = nested.groups()
        expected = re.sub(r"<class '(\w+)'>", r"\1", expected).replace("typing.Literal", "one of ")
        return f"{outer.group(1)}.{key}: invalid value {given.strip()!r}; expected {expected}"
    deep = _explain_nested(message)
    if deep:
        return deep
    errors = [line[2:] for line in lines if line.startswith("- ")]
    specific = [e for e in errors if not e.startswith(_GENERIC) and not e.startswith("Expected a ")]
    if specific:
        return specific[0]
    key = re.search(r'Parser key "([^"]+)"', message)
    given = re.search(r"(?:Given|Got) value: (.*)", message)
    single = re.search(r"Expected a (.*?)\. Got value", message)
    if single:
        errors = [f"Expected a {single.group(1)}"]
    expected = [
        e.removeprefix("Expected a ") for e in errors if e.startswith("Expected a ") and not e.startswith(_GENERIC)
    ]
    expected = [re.sub(r"<class '(\w+)'>", r"\1", e).replace("typing.Literal", "one of ") for e in expected]
    if key and given:
        return f"{key.group(1)}: invalid value {given.group(1)!r}; expected {' or '.join(expected) or 'another type'}"
    return lines[0] if lines else message


def _explain_nested(message: str) -> str | None:
    """A bad value inside a class given by ``class_path`` (the data module's ``batch_size``, the optimizer's
    ``lr``, ...): jsonargparse reports it under the outer key, nested. Name the whole key, the value and the type
    expected; None when the message is not of that kind."""
    keys = [k for k in re.findall(r'Parser key "([^"]+)"', message) if k != "init_args"]
    if len(keys) >= 2:  # a bad value: checked first, jsonargparse may also list an option it tried and refused
        key = ".".join(keys)
        not_of_type = re.findall(r"Not of type (\w+): (.*)", message)
        if not_of_type:
            name, why = not_of_type[-1]
            return f"{key}: {why.strip()} (expected {name})"
        given = re.findall(r"Given value: (.*?)(?:\. Got value:.*)?$", message, re.MULTILINE)
        expected = sorted(set(re.findall(r"Expected a <class '(\w+)'>", message)) - {"NoneType"})
        if given and expected:
            return f"{key}: invalid value {given[-1].strip()!r}; expected {' or '.join(expected)}"
    unknown = re.search(r"Option '([^']+)' is not accepted", message)
    cls = re.search(r"class_path '([^']+)'", message)
    if unknown and keys and cls:  # a misspelled init argument in a YAML file
        return (f"{keys[0]}.{unknown.group(1)}: {cls.group(1)} has no such option "
                f"(its options: --{keys[0]}.help {cls.group(1)})")  # fmt: skip
    return None


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

    At exit Python collects garbage over every object still alive: after importing torch, torchvision and
    Lightning that pass took 2.4 s of a ``fit`` on a 2-core CPU. ``gc.freeze()`` (standard library) moves the
    objects alive at that moment (the imported modules, mostly) out of the collector's reach, here before and
    after the work; the exit then took 0.5 s, and the collections during training found less to scan. Nothing
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
    from project import runs

    try:
        cli = make_cli()
        work(cli)
    except SIGTERMException:  # Lightning's loops raise it (a SystemExit without a code) after a SIGTERM
        print("error: stopped by SIGTERM; a run folder that holds a checkpoint is kept: resume it with --ckpt_path "
              "last (or the folder)", file=sys.stderr)  # fmt: skip
        return SIGTERM_STATUS
    except (ArgumentError, ValueError, MisconfigurationException, UserError) as e:
        parsing = cli is None
        status = _exit_status(e, parsing)
        if status is None:
            raise
        if parsing and not isinstance(e, MisconfigurationException):
            print(f"error: {explain_parse_error(str(e))} (see --help)", file=sys.stderr)
        else:
            print(f"error: {_one_line(e)}", file=sys.stderr)
        return status
    finally:
        runs.release_claimed()  # a run folder claimed for a command that failed before writing into it
    return 0


def _exit_status(e: BaseException, parsing: bool) -> int | None:
    """2 for a bad config, 1 for bad data or a failed run, None for a bug (re-raised with its traceback)."""
    if isinstance(e, (ArgumentError, ConfigError, MisconfigurationException)):
        return 2
    if isinstance(e, UserError):
        return 1
    # a plain ValueError: jsonargparse's type checks while parsing; Lightning's checks of settings while building
    # the Trainer (e.g. barebones with a logger) or while running
    bad_config = (parsing and "Does not validate" in str(e)) or _raised_by_lightning(e)
    return 2 if bad_config else None


def _raised_by_lightning(e: BaseException) -> bool:
    """Whether Lightning itself raised ``e`` (its checks of Trainer settings against the data raise ValueError)."""
    tb = e.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and f"{os.sep}lightning{os.sep}" in tb.tb_frame.f_code.co_filename


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())
