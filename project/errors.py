"""Errors caused by user input. ``python -m project.fit`` prints them as one line and exits non-zero."""

from __future__ import annotations

import argparse
from typing import NoReturn


class UserError(Exception):
    """Base class: the message names the bad key, value or file and says how to fix it."""


class ConfigError(UserError, ValueError):
    """A configuration value or combination of values that cannot work."""


class DataError(UserError, RuntimeError):
    """A data file is missing, truncated or fails its md5 check, or a download failed."""


class DivergenceError(UserError, RuntimeError):
    """The training loss became NaN or infinite."""


def require(condition: bool, key: str, message: str) -> None:
    """Raise :class:`ConfigError` ``"<key>: <message>"`` unless ``condition`` holds."""
    if not condition:
        raise ConfigError(f"{key}: {message}")


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser for the project's commands, whose usage errors are one line, like every other bad input:
    ``error: <what argparse found> (see <prog> --help)`` on stderr, exit status 2 (argparse's own status)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")
