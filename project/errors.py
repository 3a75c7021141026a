"""Errors caused by user input. ``python -m project.fit`` prints them as one line and exits non-zero."""

from __future__ import annotations


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
