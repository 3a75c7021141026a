"""Where a sweep's study lives: Optuna's RDB storage opened safely for many workers, and its URL shown without
the password.

* :func:`open_storage`: SQLite (serializable transactions, so that one queued trial goes to one worker) or any
  RDB URL (PostgreSQL), with heartbeats that let a dead worker's trial be failed and retried.
* :func:`expand_user`: ``~`` in an SQLite URL's file is the home folder.
* :func:`shown` / :func:`scrubbed`: a URL, or a text holding one, with its password replaced by ``***``: what
  gets printed, logged or written.
"""

from __future__ import annotations

import contextlib
import os
import re
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback


@contextlib.contextmanager
def stable() -> Iterator[None]:
    """Optuna marks the heartbeat helpers (there since 2.8/2.9) experimental: silenced around their calls only."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        yield


def _sqlite_serializable(storage: RDBStorage) -> None:
    """Make every SQLite transaction of ``storage`` ``BEGIN IMMEDIATE``.

    pysqlite starts a transaction only at the first write, so Optuna's ``SELECT ... FOR UPDATE`` then
    ``UPDATE`` (how a worker takes a queued trial) would not be atomic across processes on SQLite. This is
    SQLAlchemy's documented recipe for serializable pysqlite, applied once Optuna has set up its tables.
    """
    from sqlalchemy import event

    engine = storage.engine
    if engine.dialect.name != "sqlite":
        return

    @event.listens_for(engine, "connect")
    def _connect(dbapi_connection: Any, record: Any) -> None:
        dbapi_connection.isolation_level = None

    @event.listens_for(engine, "begin")
    def _begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    engine.dispose()  # connections opened before the listeners: closed, reopened with them


def open_storage(url: str, heartbeat_s: float | None = None, max_retry: int = 3) -> RDBStorage:
    """Optuna's RDB storage at ``url`` (SQLite: serializable, 60 s lock timeout), with heartbeats when given."""
    engine_kwargs = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {"pool_pre_ping": True}
    with stable():
        storage = _rdb(url, engine_kwargs, heartbeat_s, max_retry)
    _sqlite_serializable(storage)
    return storage


def _rdb(url: str, engine_kwargs: dict[str, Any], heartbeat_s: float | None, max_retry: int) -> RDBStorage:
    kwargs: dict[str, Any] = {}
    if heartbeat_s:
        kwargs = {
            "heartbeat_interval": max(1, round(heartbeat_s)),
            "grace_period": max(2, round(3 * heartbeat_s)),
            "heartbeat_stale_trial_callback": RetryHeartbeatStaleTrialCallback(max_retry=max_retry),
        }
    return RDBStorage(url, engine_kwargs=engine_kwargs, **kwargs)


def expand_user(url: str) -> str:
    """An SQLite URL whose database file starts with ``~`` (``sqlite:///~/studies/x.db``) with the home folder in
    its place (``os.path.expanduser``; SQLite would open a file under a folder literally named ``~``); any other URL
    unchanged."""
    prefix = "sqlite:///"
    if url.startswith(prefix) and url[len(prefix) :].startswith("~"):
        return prefix + os.path.expanduser(url[len(prefix) :])
    return url


def default_storage(folder: Path) -> str:
    return f"sqlite:///{folder.resolve() / 'study.db'}"


def shown(url: str) -> str:
    """A storage URL fit to print or store: its password replaced by ``***`` (SQLAlchemy's own rendering of a
    URL; for a string SQLAlchemy cannot parse, whatever sits between ``user:`` and ``@``)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        return make_url(url).render_as_string(hide_password=True)
    except (ArgumentError, ValueError, TypeError):
        return re.sub(r"(//[^/@:]*:)[^/]*@", r"\1***@", url)


def scrubbed(text: str, url: str) -> str:
    """``text`` (an error message, a log line) with ``url`` and its password replaced as in :func:`shown`."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    text = text.replace(url, shown(url))
    try:
        password = make_url(url).password
    except (ArgumentError, ValueError, TypeError):
        password = None
    return text.replace(str(password), "***") if password else text
