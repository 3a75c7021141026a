"""Errors caused by user input. ``python -m project.fit`` prints them as one line and exits non-zero."""

from __future__ import annotations

import argparse
from typing import Any, NoReturn


class UserError(Exception):
    """Base class: the message names the bad key, value or file and says how to fix it."""


class ConfigError(UserError, ValueError):
    """A configuration value or combination of values that cannot work."""


class UnreadableFile(ConfigError):
    """A file from elsewhere (a run folder, a logs folder) that cannot be read as data: missing, not a regular file,
    over its size limit, not UTF-8, or not valid JSON, YAML or CSV within the bounds of :mod:`project.runs.read`.
    The message is one line: the file, then the problem. A :class:`ConfigError`, so callers that refuse a bad run
    refuse this one too."""


class DataError(UserError, RuntimeError):
    """A data file is missing, truncated or fails its md5 check, or a download failed."""


class LinkOnTheWay(UserError, OSError):
    """A symbolic link or a file stands at a component of a path the project writes below a folder the user gave
    (a run folder swapped for a link mid-run, a planted link at ``checkpoints/``): refused, nothing written through
    it. An ``OSError`` whose ``errno`` is the kernel's (``ELOOP`` or ``ENOTDIR``)."""

    def __init__(self, message: str, errno: int) -> None:
        super().__init__(message)
        self.errno = errno


class DivergenceError(UserError, RuntimeError):
    """The training loss became NaN or infinite."""


class RendezvousError(UserError, RuntimeError):
    """The processes of a distributed run did not all meet within the rendezvous timeout (a node that was not
    started, a wrong node or device count, an address the others cannot reach)."""


def require(condition: bool, key: str, message: str) -> None:
    """Raise :class:`ConfigError` ``"<key>: <message>"`` unless ``condition`` holds."""
    if not condition:
        raise ConfigError(f"{key}: {message}")


def yaml_problem(path: Any, error: Exception) -> str:
    """One line for a YAML (or JSON) syntax error in file ``path``: ``<path>, line L, column C: <problem>``
    (1-based, where the parser stopped), from PyYAML's ``MarkedYAMLError``; without a position, the file and
    the parser's own words."""
    mark, start = getattr(error, "problem_mark", None), getattr(error, "context_mark", None)
    problem = getattr(error, "problem", None) or " ".join(str(error).split())
    context = getattr(error, "context", None)
    if context and start is not None and (mark is None or (start.line, start.column) != (mark.line, mark.column)):
        context = f"{context} that starts at line {start.line + 1}, column {start.column + 1}"
    what = f"{problem} ({context})" if context else problem
    mark = mark or start
    if mark is None:
        return f"{path}: not valid YAML: {what}"
    return f"{path}, line {mark.line + 1}, column {mark.column + 1}: not valid YAML: {what}"


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser for the project's commands, whose usage errors are one line, like every other bad input:
    ``error: <what argparse found> (see <prog> --help)`` on stderr, exit status 2 (argparse's own status)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")
